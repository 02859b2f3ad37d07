"""Reactions to signals of lower apps."""

from typing import Any

from django.dispatch import receiver

from conversations.signals import assistant_usage_reported
from prefix_cache.services import cache_usage_report


@receiver(assistant_usage_reported)
def record_usage_of_appended_message(
    sender: Any, *, conversation: Any, message: Any, usage: Any, **kwargs: Any
) -> None:
    cache_usage_report(conversation=conversation, usage=usage)
