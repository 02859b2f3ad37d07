"""Celery tasks of conversations and the request that queues them. They take ids and return quietly when
the row is gone; the work they run lives in conversations.embedding."""

from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from conversations.embedding import message_vectors_due, message_vectors_fill, vectors_on_append
from providers.background import task_queue_once, task_send, task_started

# A queued Celery run is marked this long (the run clears the mark when it starts; a lost run is replaced).
QUEUED_MARK_SECONDS = 300


def vectors_queued_key(conversation_id: Any) -> str:
    return f"mnemo:vectors:queued:{conversation_id}"


def message_vectors_request(*, conversation_id: Any) -> None:
    """Called when messages were written (on commit): have their vectors computed in the background. While a
    run is queued, later appends are left to it (one cache operation each, not a task message each)."""
    if not vectors_on_append():
        return
    task_queue_once(
        message_vectors_conversation,
        str(conversation_id),
        mark=vectors_queued_key(conversation_id),
        mark_seconds=QUEUED_MARK_SECONDS,
    )


# A pool child that dies mid-run puts the message back at once (the fill is idempotent).
@shared_task(acks_late=True, reject_on_worker_lost=True, soft_time_limit=600, time_limit=660)
def message_vectors_conversation(conversation_id: str) -> int:
    """Embed whatever the conversation's messages still lack (idempotent: a rerun finds nothing to do)."""
    # Messages appended from now on queue a run of their own.
    task_started(vectors_queued_key(conversation_id))
    return message_vectors_fill(conversation_id=conversation_id)


@shared_task(acks_late=True, soft_time_limit=600, time_limit=660)
def message_vectors_sweep() -> int:
    """Beat: queue the vectors of recently active conversations whose messages still lack them (a task the
    broker never took while Redis was down, or one that was lost). Returns how many were queued."""
    since = timezone.now() - timedelta(seconds=settings.MNEMO_COMPACTION_CATCHUP_LOOKBACK_SECONDS)
    due = message_vectors_due(since=since, limit=settings.MNEMO_COMPACTION_CATCHUP_LIMIT)
    return sum(task_send(message_vectors_conversation, str(conversation_id)) for conversation_id in due)
