"""Compaction records (a compact_boundary and its compact_summary messages) appended at the end of the
transcript, under the same row lock as the message appends."""

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from conversations.models import Conversation, Message
from conversations.services.announce import messages_publish
from conversations.tokens import message_token_count


def _lock_for_append(conversation: Conversation) -> Conversation:
    """The conversation row, locked until the transaction ends: every seq is assigned under this lock."""
    return (
        Conversation.objects.select_for_update().only("id", "last_seq", "tenant_id").get(pk=conversation.pk)
    )


def compaction_records_append(
    *,
    conversation: Conversation,
    records: list[dict[str, Any]],
    check: Callable[[Conversation], None] | None = None,
) -> list[Message]:
    """Append compaction records at the end of the transcript. `check` runs with the lock held, before
    anything is written, and may raise to abort (e.g. when another compaction moved the boundary first).
    Each record: role, kind, content, metadata, optional idempotency_key; records belong to no turn."""
    kinds = {Message.Kind.COMPACT_BOUNDARY, Message.Kind.COMPACT_SUMMARY}
    if not records or any(r["kind"] not in kinds for r in records):
        raise ValueError("compaction records are compact_boundary / compact_summary messages")
    with transaction.atomic():
        locked = _lock_for_append(conversation)
        if check is not None:
            check(locked)
        now = timezone.now()
        seq = locked.last_seq
        messages = []
        for record in records:
            seq += 1
            messages.append(_record_message(conversation, record, seq=seq, now=now))
        Message.objects.bulk_create(messages)
        Conversation.objects.filter(pk=locked.pk).update(last_seq=seq, updated_at=now)
        messages_publish(locked, messages)
    conversation.last_seq = seq
    return messages


def _record_message(
    conversation: Conversation, record: dict[str, Any], *, seq: int, now: datetime
) -> Message:
    return Message(
        conversation_id=conversation.pk,
        seq=seq,
        role=record["role"],
        kind=record["kind"],
        content=record["content"],
        metadata=record.get("metadata") or {},
        idempotency_key=record.get("idempotency_key"),
        token_count=message_token_count(
            role=record["role"],
            content=record["content"],
            parts=[],
            tenant_id=conversation.tenant_id,
            model=conversation.model,
        ),
        created_at=now,
    )
