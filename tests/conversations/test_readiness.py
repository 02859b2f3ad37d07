"""One readiness signal on GET conversation: vectors, the memory agent's reading and due compactions."""

import pytest

from conversations.readiness import conversation_readiness
from summaries.models import CompactionState
from tests.context.helpers import append, exchanges

pytestmark = pytest.mark.django_db


def readiness(actor, conversation) -> dict:
    response = actor.client.get(f"/api/v1/conversations/{conversation.id}")
    assert response.status_code == 200
    return response.json()["readiness"]


def test_a_conversation_with_nothing_under_way_is_ready(owner, conversation, lexical_only):
    append(conversation, {"role": "user", "content": "hello"})

    assert readiness(owner, conversation) == {"ready": True, "waiting_for": []}


def test_a_queued_compaction_is_waited_for(owner, conversation, lexical_only):
    exchanges(conversation, 2)
    CompactionState.objects.update_or_create(
        conversation=conversation, defaults={"queued_at": "2030-01-01T00:00Z"}
    )

    body = readiness(owner, conversation)
    assert body["ready"] is False and "compaction" in body["waiting_for"]


def test_a_history_past_its_budget_is_compacted_without_a_context_call(
    owner, conversation, lexical_only, django_capture_on_commit_callbacks
):
    # A loaded history over the background share of the history budget: the readiness check queues the
    # compaction a context call would have (Celery runs eagerly here, so it is done by the next look).
    conversation.tenant.settings = {**conversation.tenant.settings, "history_token_budget": 600}
    conversation.tenant.save(update_fields=["settings"])
    exchanges(conversation, 40, tokens=20)

    with django_capture_on_commit_callbacks(execute=True):
        assert "compaction" in conversation_readiness(conversation)["waiting_for"]
    assert CompactionState.objects.get(conversation=conversation).compactions >= 1
    assert "compaction" not in readiness(owner, conversation)["waiting_for"]


def test_an_outsider_gets_no_readiness(owner, outsider, conversation):
    response = outsider.client.get(f"/api/v1/conversations/{conversation.id}")

    assert response.status_code == 404
    assert "readiness" not in response.content.decode()
