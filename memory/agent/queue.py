"""Queueing the memory agent after a completed exchange: one delayed run serves a burst of exchanges
(providers.background.task_queue_once, marked by the task's memory_agent_queued_key)."""

from django.conf import settings
from django.db import transaction

from conversations.models import Conversation
from memory.tasks import memory_agent_conversation, memory_agent_queued_key
from providers.background import task_queue_once


def memory_agent_request(*, conversation: Conversation) -> bool:
    """Queue a run for after the current transaction commits, MNEMO_MEMORY_AGENT_DELAY_SECONDS later.
    Exchanges completed while a run is queued are left to it: the run reads everything since its cursor, so
    one run (and one model call) serves a burst, and an append costs one cache operation, not a query.
    The run clears the mark when it starts, so an exchange completed after that queues the next run."""
    if conversation.end_user_id is None:
        return False
    delay = settings.MNEMO_MEMORY_AGENT_DELAY_SECONDS
    conversation_id = str(conversation.id)
    # The mark outlives the countdown so a slow queue does not pile up runs; a lost run is replaced once
    # it expires.
    transaction.on_commit(
        lambda: task_queue_once(
            memory_agent_conversation,
            conversation_id,
            mark=memory_agent_queued_key(conversation_id),
            mark_seconds=delay + 300,
            countdown=delay or None,
        ),
        robust=True,
    )
    return True
