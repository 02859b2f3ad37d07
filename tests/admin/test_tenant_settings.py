"""tenant settings have a schema. The admin's form has one typed field per known setting and
refuses bad values and unknown keys; a save takes effect at the next call; a bad value stored around the
schema falls back to its default with a degradation, never a 500 (it was a ValueError in default_budget)."""

import pytest
from django.conf import settings
from django.urls import reverse

from tenants.errors import ApplicationError
from tenants.models import Tenant
from tenants.services import tenant_create
from tenants.settings_schema import SCHEMA, SettingsInvalid, settings_read, settings_validate
from tests.context.helpers import context, context_call

pytestmark = pytest.mark.django_db

BAD = {"token_budget": "lots", "bogus_key": 1}


def change_url(tenant: Tenant) -> str:
    return reverse("admin:tenants_tenant_change", args=[tenant.pk])


def form(tenant: Tenant, **values) -> dict:
    return {"name": tenant.name, **{k: "" for k in (s.key for s in SCHEMA)}, **values}


def test_the_admin_form_has_a_typed_field_per_setting(client, member, owner):
    client.force_login(member.user)
    page = client.get(change_url(owner.tenant))
    assert page.status_code == 200
    fields = page.context["adminform"].form.fields
    assert {s.key for s in SCHEMA} <= set(fields)
    assert "settings" not in fields
    assert fields["token_budget"].min_value == 256
    assert [c for c, _ in fields["history_image_detail"].choices] == ["", "low", "keep"]
    assert "server default (32000)" in fields["token_budget"].help_text


def test_a_bad_value_and_an_unknown_key_are_refused(client, member, owner):
    client.force_login(member.user)
    # What the old JSON field took: the form has no field for it, and "lots" is not a number.
    response = client.post(
        change_url(owner.tenant), form(owner.tenant, token_budget="lots", settings='{"bogus_key": 1}')
    )
    assert response.status_code == 200
    assert "token_budget" in response.context["adminform"].form.errors
    response = client.post(change_url(owner.tenant), form(owner.tenant, token_budget="100"))
    assert "greater than or equal to 256" in str(response.context["adminform"].form.errors["token_budget"])
    owner.tenant.refresh_from_db()
    assert owner.tenant.settings == {}


def test_a_valid_form_stores_typed_values_and_drops_unknown_keys(client, member, owner):
    Tenant.objects.filter(pk=owner.tenant.pk).update(settings={"bogus_key": 1, "image_retention_days": 9})
    client.force_login(member.user)
    page = client.get(change_url(owner.tenant))
    assert "bogus_key" in page.content.decode()  # shown as stored, with a note that it is dropped on save
    response = client.post(
        change_url(owner.tenant),
        form(
            owner.tenant,
            token_budget="5000",
            image_dedup="false",
            image_dedup_grid_threshold="-1",
            image_retention_days="9",
            proxy_models="gpt-4o\n\ngpt-4o-mini\n",
            history_image_detail="keep",
        ),
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    owner.tenant.refresh_from_db()
    assert owner.tenant.settings == {
        "token_budget": 5000,
        "image_dedup": False,
        "image_dedup_grid_threshold": None,
        "image_retention_days": 9,
        "proxy_models": ["gpt-4o", "gpt-4o-mini"],
        "history_image_detail": "keep",
    }


def test_support_may_not_change_settings_nor_read_keys(client, support, owner):
    Tenant.objects.filter(pk=owner.tenant.pk).update(settings={"llm_api_key": "sk-tenant-secret"})
    client.force_login(support.user)
    page = client.get(change_url(owner.tenant))
    assert page.status_code == 200
    assert "sk-tenant-secret" not in page.content.decode()
    assert client.post(change_url(owner.tenant), form(owner.tenant, token_budget="5000")).status_code == 403
    owner.tenant.refresh_from_db()
    assert owner.tenant.settings == {"llm_api_key": "sk-tenant-secret"}


def test_a_save_takes_effect_at_the_next_call(client, member, owner, conversation):
    default = settings.MNEMO_DEFAULT_TOKEN_BUDGET
    assert context(owner, conversation, user_message="hi")["token_budget"] == default
    client.force_login(member.user)
    assert client.post(change_url(owner.tenant), form(owner.tenant, token_budget="5000")).status_code == 302
    assert context(owner, conversation, user_message="hi")["token_budget"] == 5000


def test_a_bad_stored_value_falls_back_to_the_default_with_a_degradation(owner, conversation):
    Tenant.objects.filter(pk=owner.tenant.pk).update(settings=BAD)
    response = context_call(owner, conversation, user_message="hi")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["token_budget"] == settings.MNEMO_DEFAULT_TOKEN_BUDGET
    [degradation] = [d for d in body["degradations"] if d["code"] == "invalid_tenant_setting"]
    assert "token_budget" in degradation["message"] and "bogus_key" not in degradation["message"]


def test_the_service_refuses_what_the_form_refuses(db):
    with pytest.raises(ApplicationError) as refused:
        tenant_create(slug="bad-settings", settings=BAD)
    assert refused.value.code == "invalid_settings"
    assert set(refused.value.extra["fields"]) == {"token_budget", "bogus_key"}
    assert not Tenant.objects.filter(slug="bad-settings").exists()
    tenant, _ = tenant_create(slug="good-settings", settings={"token_budget": 4096})
    assert tenant.settings == {"token_budget": 4096}


@pytest.mark.parametrize(
    ("key", "bad", "good"),
    [
        ("token_budget", True, 4096),
        ("token_budget", 3_000_000, 2_000_000),
        ("image_dedup", "no", False),
        ("image_dedup_grid_threshold", -1, None),
        ("history_image_detail", "high", "low"),
        ("llm_base_url", "ftp://example.com", "https://llm.example.com/v1"),
        ("llm_model", "x" * 101, "gpt-4o-mini"),
        ("default_model", "gpt\x00", "gpt-4o"),
        ("proxy_models", "gpt-4o", ["gpt-4o"]),
        ("proxy_models", [""], []),
    ],
)
def test_the_schema_checks_types_bounds_and_choices(key, bad, good):
    assert settings_validate({key: good}) == {key: good}
    with pytest.raises(SettingsInvalid) as refused:
        settings_validate({key: bad})
    assert list(refused.value.errors) == [key]
    assert settings_read({key: bad})[0] == {}
    assert settings_read({key: good}) == ({key: good}, [])


# A value of the wrong type for every known setting, as a save around the schema could leave them.
EVERY_SETTING_BAD = {
    s.key: {"int": "lots", "bool": "no", "choice": "bogus", "list": "gpt-4o"}.get(s.kind, ["not", "text"])
    for s in SCHEMA
}


def test_every_setting_stored_bad_still_serves_the_tenant(owner):
    """Conversation, messages (with an image), context: the defaults apply and the context call says which
    settings it ignored."""
    from tests.cold_storage.helpers import frame, image_part

    Tenant.objects.filter(pk=owner.tenant.pk).update(settings=EVERY_SETTING_BAD)
    created = owner.client.post("/api/v1/conversations", {"end_user": "alice"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["model"] == settings.MNEMO_DEFAULT_MODEL
    conversation_id = created.json()["id"]
    messages = f"/api/v1/conversations/{conversation_id}/messages"
    parts = [{"type": "text", "text": "look"}, image_part(frame(1))]
    response = owner.client.post(messages, {"role": "user", "parts": parts}, format="json")
    assert response.status_code == 201, response.content
    response = owner.client.post(messages, {"role": "assistant", "content": "Seen."}, format="json")
    assert response.status_code == 201, response.content
    response = owner.client.post(
        f"/api/v1/conversations/{conversation_id}/context", {"user_message": "and now?"}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["token_budget"] == settings.MNEMO_DEFAULT_TOKEN_BUDGET
    [degradation] = [d for d in body["degradations"] if d["code"] == "invalid_tenant_setting"]
    assert all(key in degradation["message"] for key in EVERY_SETTING_BAD)


def test_background_llm_work_ignores_a_bad_endpoint(owner, conversation, settings):
    """A tenant URL that is not text was used as the endpoint (str() of whatever was stored)."""
    from memory.agent import AgentRun
    from memory.agent.llm import agent_llm
    from summaries.conf import compaction_config

    settings.LLM_BASE_URL, settings.LLM_API_KEY = "", ""
    Tenant.objects.filter(pk=owner.tenant.pk).update(
        settings={"llm_base_url": ["http://x"], "llm_api_key": 5}
    )
    conversation.tenant.refresh_from_db()
    assert compaction_config(conversation).llm is None
    assert agent_llm(conversation, AgentRun()) is None
