"""Celery tasks of memory. They take ids, hold only the retry policy and the mark of a queued run, and return
quietly when the row is gone."""

import uuid
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from conversations.models import Conversation
from memory.selectors import memory_agent_due
from memory.state import state_fold, state_fold_due
from providers.background import task_send, task_started


@shared_task(acks_late=True)
def state_fold_conversation(conversation_id: str) -> int:
    conversation = Conversation.objects.filter(pk=conversation_id).first()
    if conversation is None:
        return 0
    return state_fold(conversation=conversation)


@shared_task
def state_fold_periodic() -> int:
    """Beat: fold the task state of conversations with many or old unfolded events."""
    due = state_fold_due(
        min_events=settings.MNEMO_STATE_FOLD_MIN_EVENTS,
        min_age_seconds=settings.MNEMO_STATE_FOLD_MIN_AGE_SECONDS,
    )
    for conversation_id in due:
        state_fold_conversation.delay(str(conversation_id))
    return len(due)


def memory_agent_queued_key(conversation_id: uuid.UUID | str) -> str:
    """The cache mark of a memory_agent_conversation queued and not started (memory.agent.queue sets it)."""
    return f"mnemo:memory-agent:queued:{conversation_id}"


# Worst case with an LLM: memory.agent.run's MAX_BATCHES batches of memory.agent.llm's MAX_ROUNDS model calls;
# past the soft limit the run stops and the cursor stays where the last committed batch left it.
@shared_task(acks_late=True, soft_time_limit=600, time_limit=660)
def memory_agent_conversation(conversation_id: str) -> int:
    """Run the memory agent over the completed exchanges of one conversation (idempotent by its cursor)."""
    # memory.agent imports this module (its queue sends this task): the run is imported when the task runs.
    from memory.agent.run import memory_agent_run

    # Exchanges completed from now on queue a run of their own (memory_agent_request).
    task_started(memory_agent_queued_key(conversation_id))

    conversation = Conversation.objects.filter(pk=conversation_id).select_related("end_user").first()
    if conversation is None:
        return 0
    return len(memory_agent_run(conversation=conversation).operations)


@shared_task(acks_late=True, soft_time_limit=600, time_limit=660)
def memory_agent_sweep() -> int:
    """Beat: queue the memory agent for recently active conversations it has not read to the end (a run the
    broker never took, or one a stopped server lost). Returns how many were queued."""
    since = timezone.now() - timedelta(seconds=settings.MNEMO_COMPACTION_CATCHUP_LOOKBACK_SECONDS)
    due = memory_agent_due(since=since, limit=settings.MNEMO_COMPACTION_CATCHUP_LIMIT)
    return sum(task_send(memory_agent_conversation, str(conversation_id)) for conversation_id in due)
