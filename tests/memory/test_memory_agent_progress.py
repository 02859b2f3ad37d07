"""GET /api/v1/conversations/{id}/memory-agent: how far the memory agent has read, so that a client that
imported history can wait for its memories as it waits for the retrieval index."""

import pytest

from conversations.services import conversation_create
from memory.agent import memory_agent_run
from tests.summaries.helpers import append

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("lexical_only")]


def progress(actor, conversation):
    response = actor.client.get(f"/api/v1/conversations/{conversation.id}/memory-agent")
    return response.status_code, response.json()


def test_a_completed_exchange_is_pending_until_the_agent_has_read_it(owner, conversation):
    assert progress(owner, conversation) == (200, {"enabled": True, "read_to_seq": 0, "pending": False})
    append(conversation, {"role": "user", "content": "I prefer answers in German."})
    assert progress(owner, conversation)[1]["pending"] is False  # no reply yet: nothing to read
    append(conversation, {"role": "assistant", "content": "Noted."})
    assert progress(owner, conversation) == (200, {"enabled": True, "read_to_seq": 0, "pending": True})

    memory_agent_run(conversation=conversation)

    assert progress(owner, conversation) == (200, {"enabled": True, "read_to_seq": 2, "pending": False})


def test_a_conversation_without_an_end_user_has_no_memory_agent(owner):
    anonymous = conversation_create(tenant=owner.tenant, title="No end user")
    append(anonymous, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"})
    assert progress(owner, anonymous) == (200, {"enabled": False, "read_to_seq": 0, "pending": False})


def test_an_outsider_gets_404_for_another_tenants_conversation(outsider, conversation):
    status, body = progress(outsider, conversation)
    assert status == 404
    assert body["error"]["code"] == "not_found"


@pytest.mark.parametrize("conversation_id", ["not-a-uuid", "00000000-0000-0000-0000-000000000000", "%00"])
def test_a_malformed_or_unknown_conversation_id_is_a_404_in_the_error_shape(owner, conversation_id):
    response = owner.client.get(f"/api/v1/conversations/{conversation_id}/memory-agent")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_only_get_is_allowed(owner, conversation):
    response = owner.client.post(f"/api/v1/conversations/{conversation.id}/memory-agent", {}, format="json")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
