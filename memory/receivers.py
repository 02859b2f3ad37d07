"""Reactions to signals of lower apps."""

import uuid
from typing import Any

from django.db.models.signals import post_delete
from django.dispatch import receiver

from conversations.models import Conversation
from conversations.readiness import readiness_check_register
from conversations.signals import exchange_completed, vectors_written
from memory.agent import memory_agent_request
from memory.history_index import conversation_index_drop, conversation_index_warm
from memory.selectors import memory_agent_progress

readiness_check_register(
    "memory_agent", lambda conversation: not memory_agent_progress(conversation=conversation)["pending"]
)


@receiver(exchange_completed)
def run_memory_agent_after_an_exchange(sender: object, *, conversation: Conversation, **kwargs: Any) -> None:
    # Queued after the write commits; the run reads every exchange completed since its cursor.
    memory_agent_request(conversation=conversation)


@receiver(post_delete, sender=Conversation)
def forget_the_history_index(sender: object, *, instance: Conversation, **kwargs: Any) -> None:
    # This process's in-memory index of a deleted conversation goes with it (others drop it as it ages out;
    # nothing can query a deleted conversation).
    conversation_index_drop(instance.pk)


@receiver(vectors_written)
def bring_the_history_index_up_to_date(
    sender: object, *, conversation_id: uuid.UUID | str, **kwargs: Any
) -> None:
    conversation_index_warm(conversation_id)
