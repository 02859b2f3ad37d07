"""Amending a message already written: marking it completed, or changing an incomplete one (a streamed
reply that was cut off). A completed message's content is final."""

from typing import Any

from django.conf import settings
from django.db import transaction
from rest_framework import status

from conversations import visual
from conversations.events import event_publish
from conversations.models import Message
from conversations.serializers import MessageOutputSerializer
from conversations.services.checks import message_size
from conversations.signals import exchange_completed
from conversations.tokens import message_token_count
from tenants.errors import ApplicationError


def message_update(
    *,
    message: Message,
    completed: bool | None = None,
    content: str | None = None,
    parts: list[dict[str, Any]] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Message:
    """Mark a message completed, or amend an incomplete one. Announces the change (and a completed
    assistant reply's exchange)."""
    with transaction.atomic():
        locked = Message.objects.select_for_update().select_related("conversation").get(pk=message.pk)
        changes_text = content is not None or parts is not None
        if locked.completed and (changes_text or completed is False):
            raise ApplicationError(
                "This message is completed; its content can no longer change.",
                code="message_completed",
                status_code=status.HTTP_409_CONFLICT,
            )
        new_parts = parts if parts is not None else locked.parts
        new_content = content if content is not None else locked.content
        if changes_text or metadata is not None:
            _size_check(new_content, new_parts, metadata if metadata is not None else locked.metadata)
        fields: list[str] = []
        if changes_text:
            _text_change(locked, new_content, new_parts, check_parts=parts is not None)
            fields += ["content", "parts", "token_count"]
        if completed is not None and completed != locked.completed:
            locked.completed = completed
            fields.append("completed")
        if metadata is not None:
            locked.metadata = metadata
            fields.append("metadata")
        if fields:
            _save_and_announce(locked, fields)
    return locked


def _size_check(content: str, parts: list[dict[str, Any]], metadata: dict[str, Any]) -> None:
    size = message_size(content, parts, metadata)
    if size > settings.MNEMO_MAX_MESSAGE_BYTES:
        raise ApplicationError(
            f"The message would be {size} bytes; the limit is {settings.MNEMO_MAX_MESSAGE_BYTES}.",
            code="message_too_large",
            extra={"size_bytes": size, "limit_bytes": settings.MNEMO_MAX_MESSAGE_BYTES},
        )


def _text_change(locked: Message, content: str, parts: list[dict[str, Any]], *, check_parts: bool) -> None:
    """New content and parts, the images they name checked (an edit can only name stored images) and the
    tokens counted again."""
    tenant_id = locked.conversation.tenant_id
    if check_parts:
        visual.parts_check_references(parts, tenant_id=tenant_id)
    locked.content, locked.parts = content, parts
    locked.token_count = message_token_count(
        role=locked.role,
        content=content,
        parts=parts,
        tenant_id=tenant_id,
        model=locked.conversation.model,
        name=locked.name,
    )


def _save_and_announce(locked: Message, fields: list[str]) -> None:
    locked.save(update_fields=fields)
    if "completed" in fields and locked.completed and locked.role == Message.Role.ASSISTANT:
        exchange_completed.send(sender=Message, conversation=locked.conversation)
    event_publish(
        tenant_id=locked.conversation.tenant_id,
        conversation_id=locked.conversation_id,
        event="message.updated",
        data=MessageOutputSerializer(locked).data,
    )
