"""Keeping this process's conversation indexes (retrieval.history) in step with the database."""

import uuid
from typing import Any

from django.db.models.signals import post_delete
from django.dispatch import receiver

from conversations.models import Conversation
from conversations.signals import vectors_written
from retrieval.history import conversation_index_drop, conversation_index_warm


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
