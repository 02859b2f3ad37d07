"""Reactions to signals of lower apps."""

from typing import Any

from django.dispatch import receiver

from conversations.models import Conversation
from conversations.readiness import readiness_check_register
from conversations.signals import exchange_completed
from memory.agent import memory_agent_request
from memory.selectors import memory_agent_progress

readiness_check_register(
    "memory_agent", lambda conversation: not memory_agent_progress(conversation=conversation)["pending"]
)


@receiver(exchange_completed)
def run_memory_agent_after_an_exchange(sender: object, *, conversation: Conversation, **kwargs: Any) -> None:
    # Queued after the write commits; the run reads every exchange completed since its cursor.
    memory_agent_request(conversation=conversation)
