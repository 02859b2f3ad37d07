"""Reactions to signals of lower apps."""

from typing import Any

from django.dispatch import receiver

from conversations.signals import exchange_completed
from memory.agent import memory_agent_request


@receiver(exchange_completed)
def run_memory_agent_after_an_exchange(sender: Any, *, conversation: Any, **kwargs: Any) -> None:
    # Queued after the write commits; the run reads every exchange completed since its cursor.
    memory_agent_request(conversation=conversation)
