"""Celery tasks of conversations. They take ids, import their service inside the function and return quietly
when the row is gone."""

from celery import shared_task


# A pool child that dies mid-run puts the message back at once (the fill is idempotent).
@shared_task(acks_late=True, reject_on_worker_lost=True, soft_time_limit=600, time_limit=660)
def message_vectors_conversation(conversation_id: str) -> int:
    """Embed whatever the conversation's messages still lack (idempotent: a rerun finds nothing to do)."""
    from conversations.embedding import message_vectors_fill, vectors_queued_key
    from providers.background import task_started

    # Messages appended from now on queue a run of their own.
    task_started(vectors_queued_key(conversation_id))
    return message_vectors_fill(conversation_id=conversation_id)


@shared_task(acks_late=True, soft_time_limit=600, time_limit=660)
def message_vectors_sweep() -> int:
    """Beat: queue the vectors of recently active conversations whose messages still lack them (a task the
    broker never took while Redis was down, or one that was lost). Returns how many were queued."""
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from conversations.embedding import message_vectors_due
    from providers.background import task_send

    since = timezone.now() - timedelta(seconds=settings.MNEMO_COMPACTION_CATCHUP_LOOKBACK_SECONDS)
    due = message_vectors_due(since=since, limit=settings.MNEMO_COMPACTION_CATCHUP_LIMIT)
    return sum(task_send(message_vectors_conversation, str(conversation_id)) for conversation_id in due)
