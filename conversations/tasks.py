"""Celery tasks of conversations. They take ids, import their service inside the function and return quietly
when the row is gone."""

from celery import shared_task


@shared_task(acks_late=True, soft_time_limit=600, time_limit=660)
def message_vectors_conversation(conversation_id: str) -> int:
    """Embed whatever the conversation's messages still lack (idempotent: a rerun finds nothing to do)."""
    from django.core.cache import cache

    from conversations.embedding import message_vectors_fill, vectors_queued_key

    # Messages appended from now on queue a run of their own.
    cache.delete(vectors_queued_key(conversation_id))
    return message_vectors_fill(conversation_id=conversation_id)
