"""Agent profiles (B1): the CRUD API, one default per tenant, assignment to a conversation, and which
profile a context call uses."""

import uuid

import pytest

from context.models import AgentProfile, ConversationContext
from context.services import agent_profile_create
from tests.context.helpers import context, context_call, error_code

pytestmark = pytest.mark.django_db

PROFILES = "/api/v1/agent-profiles"


def detail(profile_id):
    return f"{PROFILES}/{profile_id}"


def assignment(conversation):
    return f"/api/v1/conversations/{conversation.id}/agent-profile"


def create(actor, **body):
    response = actor.client.post(PROFILES, body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_create_list_get_patch_delete(owner):
    created = create(owner, name="Support", scope="billing", policy="Be kind.")
    assert {k: created[k] for k in ("name", "scope", "policy", "is_default", "version")} == {
        "name": "Support",
        "scope": "billing",
        "policy": "Be kind.",
        "is_default": False,
        "version": 1,
    }
    create(owner, name="Analyst")
    listed = owner.client.get(PROFILES).json()["results"]
    assert [p["name"] for p in listed] == ["Analyst", "Support"]
    assert owner.client.get(detail(created["id"])).json() == created

    response = owner.client.patch(detail(created["id"]), {"policy": "Be kind and brief."}, format="json")
    assert response.status_code == 200
    assert (response.json()["policy"], response.json()["version"]) == ("Be kind and brief.", 2)

    response = owner.client.delete(detail(created["id"]))
    assert response.status_code == 204
    assert owner.client.get(detail(created["id"])).status_code == 404
    assert [p["name"] for p in owner.client.get(PROFILES).json()["results"]] == ["Analyst"]


@pytest.mark.parametrize(
    ("patch", "version"),
    [
        ({"name": "Support 2"}, 2),
        ({"scope": "refunds"}, 2),
        ({"policy": "New rules."}, 2),
        ({"is_default": True}, 1),
        ({"name": "Support", "scope": "billing", "policy": "Be kind."}, 1),  # same text
        ({}, 1),
    ],
)
def test_the_version_moves_only_when_the_rendered_text_changes(owner, patch, version):
    created = create(owner, name="Support", scope="billing", policy="Be kind.")
    response = owner.client.patch(detail(created["id"]), patch, format="json")
    assert response.status_code == 200
    assert response.json()["version"] == version
    assert AgentProfile.objects.get(pk=created["id"]).version == version


def test_one_default_per_tenant(owner, outsider):
    theirs = create(outsider, name="Theirs", is_default=True)
    first = create(owner, name="First", is_default=True)
    second = create(owner, name="Second", is_default=True)
    defaults = AgentProfile.objects.filter(tenant=owner.tenant, is_default=True)
    assert [str(p.id) for p in defaults] == [second["id"]]

    response = owner.client.patch(detail(first["id"]), {"is_default": True}, format="json")
    assert response.json()["is_default"] is True
    assert owner.client.get(detail(second["id"])).json()["is_default"] is False
    # Another tenant's default is not touched.
    assert AgentProfile.objects.get(pk=theirs["id"]).is_default is True


def test_a_duplicate_name_is_409_and_changes_nothing(owner, outsider):
    create(owner, name="Support", is_default=True)
    other = create(owner, name="Other")
    response = owner.client.post(PROFILES, {"name": "Support", "is_default": True}, format="json")
    assert response.status_code == 409
    assert error_code(response) == "agent_profile_exists"
    assert AgentProfile.objects.filter(tenant=owner.tenant).count() == 2
    assert AgentProfile.objects.get(tenant=owner.tenant, is_default=True).name == "Support"

    response = owner.client.patch(detail(other["id"]), {"name": "Support"}, format="json")
    assert response.status_code == 409
    assert error_code(response) == "agent_profile_exists"
    assert AgentProfile.objects.get(pk=other["id"]).name == "Other"
    # Names are unique per tenant, not globally.
    create(outsider, name="Support")


@pytest.mark.parametrize(
    ("method", "body"),
    [
        ("post", {"name": "X", "tone": "warm"}),
        ("patch", {"tone": "warm"}),
        ("put", {"agent_profile": None, "x": 1}),
    ],
)
def test_unknown_fields_are_refused(owner, conversation, method, body):
    profile = create(owner, name="Support")
    url = {"post": PROFILES, "patch": detail(profile["id"]), "put": assignment(conversation)}[method]
    response = getattr(owner.client, method)(url, body, format="json")
    assert response.status_code == 400
    assert error_code(response) == "unknown_field"


def test_bad_values_are_refused(owner):
    assert error_code(owner.client.post(PROFILES, {"scope": "no name"}, format="json")) == "required"
    assert error_code(owner.client.post(PROFILES, {"name": "x" * 101}, format="json")) == "max_length"
    assert error_code(owner.client.post(PROFILES, {"name": ""}, format="json")) == "blank"


def test_the_context_uses_the_assigned_profile_then_the_tenant_default(owner, conversation):
    default = create(owner, name="Default", policy="Default rules.", is_default=True)
    assigned = create(owner, name="Assigned", policy="Assigned rules.")

    body = context(owner, conversation, user_message="hi")
    assert body["blocks"]["B1"]["items"] == [{"kind": "agent_profile", "id": default["id"], "version": 1}]
    assert body["system"] == "You are Default.\nPolicy:\nDefault rules."

    response = owner.client.put(assignment(conversation), {"agent_profile": assigned["id"]}, format="json")
    assert response.status_code == 200
    assert response.json()["agent_profile"]["id"] == assigned["id"]
    assert ConversationContext.objects.get(conversation=conversation).agent_profile_id == uuid.UUID(
        assigned["id"]
    )
    body = context(owner, conversation, user_message="hi")
    assert body["blocks"]["B1"]["items"] == [{"kind": "agent_profile", "id": assigned["id"], "version": 1}]
    assert body["system"] == "You are Assigned.\nPolicy:\nAssigned rules."

    # An edit shows up at once, with the new version in the provenance and a new B1 hash.
    owner.client.patch(detail(assigned["id"]), {"scope": "deployments"}, format="json")
    edited = context(owner, conversation, user_message="hi")
    assert edited["blocks"]["B1"]["items"][0]["version"] == 2
    assert edited["system"] == "You are Assigned, responsible for deployments.\nPolicy:\nAssigned rules."
    assert edited["prefix"]["hashes"]["B1"] != body["prefix"]["hashes"]["B1"]

    # Unassigning falls back to the tenant default.
    response = owner.client.put(assignment(conversation), {"agent_profile": None}, format="json")
    assert response.json() == {"agent_profile": None}
    assert context(owner, conversation, user_message="hi")["blocks"]["B1"]["items"][0]["id"] == default["id"]


def test_a_request_override_beats_the_assignment_and_the_default(owner, conversation):
    create(owner, name="Default", is_default=True)
    assigned = create(owner, name="Assigned")
    override = create(owner, name="Override", policy="Only for this call.")
    owner.client.put(assignment(conversation), {"agent_profile": assigned["id"]}, format="json")

    body = context(owner, conversation, user_message="hi", agent_profile=override["id"])
    assert body["blocks"]["B1"]["items"][0]["id"] == override["id"]
    assert body["system"] == "You are Override.\nPolicy:\nOnly for this call."
    # The override is for that call only.
    assert context(owner, conversation, user_message="hi")["blocks"]["B1"]["items"][0]["id"] == assigned["id"]


def test_deleting_the_assigned_profile_falls_back_to_the_default(owner, conversation):
    default = create(owner, name="Default", is_default=True)
    assigned = create(owner, name="Assigned")
    owner.client.put(assignment(conversation), {"agent_profile": assigned["id"]}, format="json")
    assert owner.client.delete(detail(assigned["id"])).status_code == 204
    assert ConversationContext.objects.get(conversation=conversation).agent_profile_id is None
    assert context(owner, conversation, user_message="hi")["blocks"]["B1"]["items"][0]["id"] == default["id"]


def test_another_tenants_profile_is_invisible(owner, outsider, conversation, outsider_conversation):
    mine = create(owner, name="Mine", policy="Owner secrets.", is_default=True)
    theirs = agent_profile_create(tenant=outsider.tenant, name="Theirs", policy="Outsider rules.")

    assert [p["name"] for p in outsider.client.get(PROFILES).json()["results"]] == ["Theirs"]
    for method, body in (("get", None), ("patch", {"policy": "hijacked"}), ("delete", None)):
        response = getattr(outsider.client, method)(detail(mine["id"]), body, format="json")
        assert response.status_code == 404, method
        assert "Owner secrets" not in response.content.decode()
    assert AgentProfile.objects.get(pk=mine["id"]).policy == "Owner secrets."

    # The outsider cannot assign to the owner's conversation, nor assign the owner's profile to its own.
    response = outsider.client.put(assignment(conversation), {"agent_profile": str(theirs.id)}, format="json")
    assert response.status_code == 404
    response = outsider.client.put(
        assignment(outsider_conversation), {"agent_profile": mine["id"]}, format="json"
    )
    assert response.status_code == 404
    # The owner cannot use the outsider's profile either: not by assignment, not by override.
    response = owner.client.put(assignment(conversation), {"agent_profile": str(theirs.id)}, format="json")
    assert response.status_code == 404
    response = context_call(owner, conversation, user_message="hi", agent_profile=str(theirs.id))
    assert response.status_code == 400
    assert error_code(response) == "invalid_agent_profile"
    assert not ConversationContext.objects.filter(agent_profile=theirs).exists()


def test_unknown_profile_ids(owner, conversation):
    missing = str(uuid.uuid4())
    assert owner.client.get(detail(missing)).status_code == 404
    assert owner.client.get(detail("not-a-uuid")).status_code == 404
    assert (
        owner.client.put(assignment(conversation), {"agent_profile": missing}, format="json").status_code
        == 404
    )
    response = context_call(owner, conversation, user_message="hi", agent_profile=missing)
    assert error_code(response) == "invalid_agent_profile"


def test_anonymous_gets_401_everywhere(anonymous, owner, conversation):
    profile = create(owner, name="Support")
    calls = [
        ("get", PROFILES, None),
        ("post", PROFILES, {"name": "X"}),
        ("get", detail(profile["id"]), None),
        ("patch", detail(profile["id"]), {"policy": "x"}),
        ("delete", detail(profile["id"]), None),
        ("put", assignment(conversation), {"agent_profile": profile["id"]}),
    ]
    for method, url, body in calls:
        assert getattr(anonymous, method)(url, body, format="json").status_code == 401, (method, url)
    assert AgentProfile.objects.get(pk=profile["id"]).policy == ""
