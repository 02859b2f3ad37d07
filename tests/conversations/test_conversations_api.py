import pytest

from conversations.models import Conversation, Message
from tests.factories import ConversationFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/conversations"


def test_create_with_end_user_and_defaults(owner):
    response = owner.client.post(URL, {"end_user": "alice", "title": "Trip"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["end_user"] == "alice"
    assert body["model"] == "gpt-4o"  # settings.MNEMO_DEFAULT_MODEL
    assert body["message_count"] == 0
    conversation = Conversation.objects.get(pk=body["id"])
    assert conversation.tenant == owner.tenant
    assert conversation.end_user.tenant == owner.tenant


def test_create_uses_the_tenant_default_model(owner):
    owner.tenant.settings = {"default_model": "claude-sonnet-4"}
    owner.tenant.save()
    assert owner.client.post(URL, {}, format="json").json()["model"] == "claude-sonnet-4"


def test_same_external_id_in_two_tenants_are_two_users(owner, outsider):
    a = owner.client.post(URL, {"end_user": "bob"}, format="json").json()
    b = outsider.client.post(URL, {"end_user": "bob"}, format="json").json()
    assert (
        Conversation.objects.get(pk=a["id"]).end_user_id != Conversation.objects.get(pk=b["id"]).end_user_id
    )


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"titel": "typo"}, "unknown_field"),
        ({"metadata": ["not", "an", "object"]}, "invalid_metadata"),
        ({"title": "x" * 301}, "max_length"),
        ({"model": ""}, "blank"),
        (["not an object"], "invalid"),
    ],
)
def test_create_bad_input(owner, payload, code):
    response = owner.client.post(URL, payload, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    assert Conversation.objects.count() == 0


def test_malformed_json_and_wrong_media_type(owner):
    response = owner.client.post(URL, "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_json"
    response = owner.client.post(URL, "a=b", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"


def test_list_is_tenant_scoped_and_filters_by_end_user(owner, outsider, conversation, outsider_conversation):
    owner.client.post(URL, {"end_user": "carol"}, format="json")
    ids = {c["id"] for c in owner.client.get(URL).json()["results"]}
    assert str(conversation.id) in ids
    assert str(outsider_conversation.id) not in ids
    assert len(ids) == 2
    only_alice = owner.client.get(URL, {"end_user": "alice"}).json()["results"]
    assert [c["id"] for c in only_alice] == [str(conversation.id)]
    # The outsider has a "mallory", the owner does not: the filter never crosses tenants.
    assert owner.client.get(URL, {"end_user": "mallory"}).json()["results"] == []


def test_cursor_pagination_walks_every_conversation_once(owner):
    ConversationFactory.create_batch(7, tenant=owner.tenant)
    seen: list[str] = []
    url = f"{URL}?limit=3"
    pages = 0
    while url:
        body = owner.client.get(url).json()
        seen += [c["id"] for c in body["results"]]
        url = body["next"]
        pages += 1
    assert pages == 3
    assert len(seen) == len(set(seen)) == 7


def test_bad_cursor_and_limit(owner):
    response = owner.client.get(URL, {"cursor": "garbage!"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_cursor"


def test_get_patch_delete(owner, conversation):
    detail = f"{URL}/{conversation.id}"
    assert owner.client.get(detail).json()["title"] == "Owner's conversation"
    response = owner.client.patch(
        detail, {"title": "Renamed", "archived": True, "metadata": {"k": 1}}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["archived"] is True
    assert response.json()["metadata"] == {"k": 1}
    response = owner.client.patch(detail, {"archived": False}, format="json")
    assert response.json()["archived"] is False
    assert response.json()["title"] == "Renamed"
    owner.client.post(f"{detail}/messages", {"role": "user", "content": "hi"}, format="json")
    assert owner.client.delete(detail).status_code == 204
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Message.objects.filter(conversation_id=conversation.pk).exists()
    assert owner.client.get(detail).status_code == 404


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"id": "x"}, "unknown_field"),
        ({"last_seq": 5}, "unknown_field"),
        ({"archived": "sometimes"}, "invalid"),
    ],
)
def test_patch_bad_input_changes_nothing(owner, conversation, payload, code):
    response = owner.client.patch(f"{URL}/{conversation.id}", payload, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    conversation.refresh_from_db()
    assert conversation.archived_at is None
    assert conversation.last_seq == 0


def test_outsider_gets_404_everywhere(outsider, conversation):
    detail = f"{URL}/{conversation.id}"
    for response in (
        outsider.client.get(detail),
        outsider.client.patch(detail, {"title": "pwned"}, format="json"),
        outsider.client.delete(detail),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    conversation.refresh_from_db()
    assert conversation.title == "Owner's conversation"


def test_malformed_id_is_404(owner):
    assert owner.client.get(f"{URL}/not-a-uuid").status_code == 404


def test_anonymous_gets_401(anonymous, conversation):
    assert anonymous.get(URL).status_code == 401
    assert anonymous.post(URL, {}, format="json").status_code == 401
    assert anonymous.get(f"{URL}/{conversation.id}").status_code == 401
