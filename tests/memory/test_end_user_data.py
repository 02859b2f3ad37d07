"""End-user data: the export holds everything about the user; the delete removes all of it and nothing of
anyone else's."""

import pytest

from conversations.models import Conversation, Message
from conversations.services import conversation_create
from memory.models import ArchivalMemory, CoreMemoryBlock, MemoryOperation, StateEvent
from tenants.models import EndUser
from tests.memory.helpers import put_block
from tests.summaries.helpers import append

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice_data(owner, conversation, settings):
    settings.MNEMO_EMBEDDINGS = "none"
    put_block(owner, "persona", "Alice, release manager")
    put_block(owner, "persona", "Alice, release manager and on-call", version=1)
    owner.client.post(
        "/api/v1/users/alice/memories", {"content": "My favourite colour is green."}, format="json"
    )
    owner.client.post(
        "/api/v1/users/alice/memories", {"content": "My favourite colour is blue."}, format="json"
    )
    append(conversation, {"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi Alice"})
    owner.client.post(
        f"/api/v1/conversations/{conversation.id}/state/events",
        {
            "expected_epoch": 0,
            "request_id": "r1",
            "event_type": "set",
            "payload": {"path": "step", "value": 1},
        },
        format="json",
    )
    # Someone else in the same tenant, who must survive the delete.
    bob_conversation = conversation_create(tenant=owner.tenant, end_user_external_id="bob", title="Bob's")
    append(bob_conversation, {"role": "user", "content": "bob here"})
    put_block(owner, "persona", "Bob", user="bob")
    return bob_conversation


def test_export_holds_everything(owner, conversation, alice_data):
    response = owner.client.get("/api/v1/users/alice/export")
    assert response.status_code == 200
    body = response.json()
    assert body["external_id"] == "alice"
    (persona,) = body["core_memory"]
    assert persona["version"] == 2 and [h["version"] for h in persona["history"]] == [1, 2]
    assert {m["content"] for m in body["archival_memories"]} == {
        "My favourite colour is green.",
        "My favourite colour is blue.",
    }
    assert any(m["invalidated_at"] for m in body["archival_memories"])
    assert len(body["memory_operations"]) == 5  # create, update, insert, insert, invalidate
    (conv,) = body["conversations"]
    assert [m["content"] for m in conv["messages"]] == ["hello", "hi Alice"]
    assert conv["task_state"]["events"][0]["request_id"] == "r1"
    assert "bob" not in response.content.decode().lower()


def test_delete_removes_all_of_it_and_only_it(owner, conversation, alice_data):
    response = owner.client.delete("/api/v1/users/alice")
    assert response.status_code == 200
    assert response.json()["deleted"] == {
        "conversations": 1,
        "core_memory_blocks": 1,
        "archival_memories": 2,
        "memory_operations": 5,
    }
    assert not EndUser.objects.filter(external_id="alice").exists()
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Message.objects.filter(conversation_id=conversation.pk).exists()
    assert not StateEvent.objects.filter(conversation_id=conversation.pk).exists()
    assert not ArchivalMemory.objects.filter(end_user__external_id="alice").exists()
    assert list(CoreMemoryBlock.objects.values_list("end_user__external_id", flat=True)) == ["bob"]
    assert MemoryOperation.objects.filter(end_user__external_id="bob").count() == 1
    assert Message.objects.filter(conversation=alice_data).count() == 1
    assert owner.client.get("/api/v1/users/alice/export").status_code == 404


def test_outsider_and_anonymous(owner, outsider, anonymous, conversation, alice_data):
    assert outsider.client.get("/api/v1/users/alice/export").status_code == 404
    assert outsider.client.delete("/api/v1/users/alice").status_code == 404
    assert anonymous.get("/api/v1/users/alice/export").status_code == 401
    assert anonymous.delete("/api/v1/users/alice").status_code == 401
    assert owner.client.get("/api/v1/users/nobody/export").status_code == 404
    assert owner.client.delete("/api/v1/users/nobody").status_code == 404
    assert EndUser.objects.filter(tenant=owner.tenant, external_id="alice").exists()
