"""Writes to conversations, turns and messages. `seq` and turn indexes are assigned under a row lock on
the conversation, so concurrent writers (threads, processes, hosts) never gap or collide."""

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework import status

from conversations.events import event_publish
from conversations.models import Conversation, Message, Turn
from conversations.parts import parts_text, parts_token_text
from conversations.serializers import MessageOutputSerializer, TurnOutputSerializer
from conversations.signals import assistant_usage_reported
from providers.tokens import count_message
from tenants.errors import ApplicationError
from tenants.models import Tenant
from tenants.services import end_user_get_or_create


def default_model(tenant: Tenant) -> str:
    return (tenant.settings or {}).get("default_model") or settings.MNEMO_DEFAULT_MODEL


def conversation_create(
    *,
    tenant: Tenant,
    end_user_external_id: str | None = None,
    model: str | None = None,
    title: str = "",
    metadata: dict[str, Any] | None = None,
) -> Conversation:
    end_user = (
        end_user_get_or_create(tenant=tenant, external_id=end_user_external_id)
        if end_user_external_id
        else None
    )
    return Conversation.objects.create(
        tenant=tenant,
        end_user=end_user,
        model=model or default_model(tenant),
        title=title,
        metadata=metadata or {},
    )


def conversation_update(*, conversation: Conversation, **fields: Any) -> Conversation:
    """Change title, model, metadata or the archived flag; other fields are not client-editable."""
    allowed = {"title", "model", "metadata", "archived"}
    unknown = set(fields) - allowed
    if unknown:
        raise ValueError(f"not editable: {sorted(unknown)}")
    if "archived" in fields:
        archived = fields.pop("archived")
        if archived and conversation.archived_at is None:
            conversation.archived_at = timezone.now()
        elif not archived:
            conversation.archived_at = None
        fields["archived_at"] = conversation.archived_at
    for name, value in fields.items():
        setattr(conversation, name, value)
    conversation.updated_at = timezone.now()
    conversation.save(update_fields=[*fields, "updated_at"])
    return conversation


@transaction.atomic
def conversation_delete(*, conversation: Conversation) -> None:
    """Purge the conversation and its whole transcript. This is the explicit delete; compaction never
    removes raw messages."""
    Message.objects.filter(conversation=conversation).delete()
    conversation.delete()


# --- messages ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppendResult:
    message: Message
    created: bool


def message_size(content: str, parts: list[dict[str, Any]]) -> int:
    size = len(content.encode())
    if parts:
        size += len(json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode())
    return size


def message_token_count(*, role: str, content: str, parts: list[dict[str, Any]], model: str) -> int:
    return count_message(role=role, content=content, model=model, extra_text=parts_token_text(parts))


def _prepare(item: dict[str, Any], *, index: int, model: str) -> dict[str, Any]:
    """Normalise one validated message and count its tokens (outside the lock: tokenising is the
    slow part)."""
    parts = item.get("parts") or []
    content = item.get("content")
    if content is None:
        content = parts_text(parts)
    completed = item.get("completed", True)
    if not content and not parts and completed:
        raise ApplicationError(
            f"Message {index} is empty: give content or parts "
            "(or completed=false for a reply still streaming).",
            code="empty_message",
            extra={"index": index},
        )
    size = message_size(content, parts)
    if size > settings.MNEMO_MAX_MESSAGE_BYTES:
        raise ApplicationError(
            f"Message {index} is {size} bytes; the limit is {settings.MNEMO_MAX_MESSAGE_BYTES}.",
            code="message_too_large",
            extra={"index": index, "size_bytes": size, "limit_bytes": settings.MNEMO_MAX_MESSAGE_BYTES},
        )
    role = item["role"]
    usage = item.get("usage")
    if usage is not None and role != Message.Role.ASSISTANT:
        raise ApplicationError(
            f"Message {index}: usage belongs on assistant messages.",
            code="usage_not_allowed",
            extra={"index": index},
        )
    return {
        "usage": usage,
        "role": role,
        "kind": item.get("kind", Message.Kind.MESSAGE),
        "content": content,
        "parts": parts,
        "completed": completed,
        "is_error": item.get("is_error", False),
        "metadata": item.get("metadata") or {},
        "idempotency_key": item.get("idempotency_key"),
        "turn_id": item.get("turn_id"),
        "parent_id": item.get("parent_id"),
        "token_count": message_token_count(role=role, content=content, parts=parts, model=model),
    }


def _same_message(existing: Message, prepared: dict[str, Any]) -> bool:
    return (
        existing.role == prepared["role"]
        and existing.kind == prepared["kind"]
        and existing.content == prepared["content"]
        and existing.parts == prepared["parts"]
    )


def _idempotency_keys(items: list[dict[str, Any]], header_key: str | None) -> list[str | None]:
    keys: list[str | None] = []
    for index, item in enumerate(items):
        own = item.get("idempotency_key")
        if header_key is not None:
            derived = header_key if len(items) == 1 else f"{header_key}:{index}"
            if own is not None and own != derived:
                raise ApplicationError(
                    "The Idempotency-Key header and the message's idempotency_key disagree.",
                    code="idempotency_key_mismatch",
                    extra={"index": index},
                )
            own = derived
        keys.append(own)
    present = [k for k in keys if k is not None]
    if len(present) != len(set(present)):
        raise ApplicationError(
            "Two messages of the batch share an idempotency key.", code="duplicate_idempotency_key"
        )
    return keys


def message_append_batch(
    *, conversation: Conversation, items: list[dict[str, Any]], idempotency_key: str | None = None
) -> list[AppendResult]:
    """Append messages in order, all or nothing. A message whose idempotency key was seen before is not
    written again: its original is returned (created=False); the same key with different content is a 409."""
    if not items:
        raise ApplicationError("No messages given.", code="empty_batch")
    if len(items) > settings.MNEMO_MAX_BATCH_MESSAGES:
        raise ApplicationError(
            f"A batch holds at most {settings.MNEMO_MAX_BATCH_MESSAGES} messages.",
            code="batch_too_large",
            extra={"limit": settings.MNEMO_MAX_BATCH_MESSAGES, "given": len(items)},
        )
    keys = _idempotency_keys(items, idempotency_key)
    prepared = []
    for index, (item, key) in enumerate(zip(items, keys, strict=True)):
        row = _prepare(item, index=index, model=conversation.model)
        row["idempotency_key"] = key
        prepared.append(row)

    with transaction.atomic():
        locked = (
            Conversation.objects.select_for_update()
            .only("id", "last_seq", "tenant_id")
            .get(pk=conversation.pk)
        )
        present_keys = [k for k in keys if k is not None]
        existing = (
            {
                m.idempotency_key: m
                for m in Message.objects.filter(conversation=locked, idempotency_key__in=present_keys)
            }
            if present_keys
            else {}
        )
        turn_ids = {row["turn_id"] for row in prepared if row["turn_id"] is not None}
        turns = (
            {t.id: t for t in Turn.objects.filter(conversation=locked, id__in=turn_ids)} if turn_ids else {}
        )
        active_turn_id = None
        if any(row["turn_id"] is None for row in prepared):
            active_turn_id = (
                Turn.objects.filter(conversation=locked, status=Turn.Status.ACTIVE)
                .values_list("id", flat=True)
                .first()
            )
        parent_ids = {row["parent_id"] for row in prepared if row["parent_id"] is not None}
        if parent_ids:
            found = set(
                Message.objects.filter(conversation=locked, id__in=parent_ids).values_list("id", flat=True)
            )
            if parent_ids - found:
                raise ApplicationError(
                    "parent_id must name an earlier message of this conversation.", code="invalid_parent"
                )

        results: list[AppendResult | None] = []
        usages: list[tuple[Message, dict[str, Any]]] = []
        to_create: list[Message] = []
        now = timezone.now()
        seq = locked.last_seq
        for index, row in enumerate(prepared):
            key = row["idempotency_key"]
            if key is not None and key in existing:
                if not _same_message(existing[key], row):
                    raise ApplicationError(
                        "This idempotency key was used for a different message.",
                        code="idempotency_conflict",
                        status_code=status.HTTP_409_CONFLICT,
                        extra={"index": index, "message_id": str(existing[key].id)},
                    )
                results.append(AppendResult(existing[key], created=False))
                continue
            usage = row.pop("usage")
            turn_id = row.pop("turn_id")
            if turn_id is not None:
                turn = turns.get(turn_id)
                if turn is None:
                    raise ApplicationError(
                        "turn_id does not name a turn of this conversation.",
                        code="invalid_turn",
                        extra={"index": index},
                    )
                if turn.status != Turn.Status.ACTIVE:
                    raise ApplicationError(
                        "That turn has ended; start a new turn to add messages.",
                        code="turn_ended",
                        status_code=status.HTTP_409_CONFLICT,
                        extra={"index": index, "turn_id": str(turn_id)},
                    )
            else:
                turn_id = active_turn_id
            seq += 1
            message = Message(conversation_id=locked.id, seq=seq, turn_id=turn_id, created_at=now, **row)
            to_create.append(message)
            results.append(AppendResult(message, created=True))
            if usage is not None:
                usages.append((message, usage))

        if to_create:
            Message.objects.bulk_create(to_create)
            Conversation.objects.filter(pk=locked.pk).update(last_seq=seq, updated_at=now)
            for message, usage in usages:
                assistant_usage_reported.send(
                    sender=Message, conversation=conversation, message=message, usage=usage
                )
            for message in to_create:
                event_publish(
                    tenant_id=locked.tenant_id,
                    conversation_id=locked.id,
                    event="message.appended",
                    data=MessageOutputSerializer(message).data,
                )
    conversation.last_seq = seq
    return [r for r in results if r is not None]


def message_update(
    *,
    message: Message,
    completed: bool | None = None,
    content: str | None = None,
    parts: list[dict[str, Any]] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Message:
    """Mark a message completed, or amend an incomplete one (a streamed reply that was cut off). A completed
    message's content is final."""
    with transaction.atomic():
        locked = Message.objects.select_for_update().select_related("conversation").get(pk=message.pk)
        changes_text = content is not None or parts is not None
        if locked.completed and (changes_text or completed is False):
            raise ApplicationError(
                "This message is completed; its content can no longer change.",
                code="message_completed",
                status_code=status.HTTP_409_CONFLICT,
            )
        fields: list[str] = []
        if changes_text:
            new_parts = parts if parts is not None else locked.parts
            new_content = content if content is not None else locked.content
            size = message_size(new_content, new_parts)
            if size > settings.MNEMO_MAX_MESSAGE_BYTES:
                raise ApplicationError(
                    f"The message would be {size} bytes; the limit is {settings.MNEMO_MAX_MESSAGE_BYTES}.",
                    code="message_too_large",
                    extra={"size_bytes": size, "limit_bytes": settings.MNEMO_MAX_MESSAGE_BYTES},
                )
            locked.content, locked.parts = new_content, new_parts
            locked.token_count = message_token_count(
                role=locked.role, content=new_content, parts=new_parts, model=locked.conversation.model
            )
            fields += ["content", "parts", "token_count"]
        if completed is not None and completed != locked.completed:
            locked.completed = completed
            fields.append("completed")
        if metadata is not None:
            locked.metadata = metadata
            fields.append("metadata")
        if fields:
            locked.save(update_fields=fields)
            event_publish(
                tenant_id=locked.conversation.tenant_id,
                conversation_id=locked.conversation_id,
                event="message.updated",
                data=MessageOutputSerializer(locked).data,
            )
    return locked


# --- turns -------------------------------------------------------------------------------------------------


def _end_turn(turn: Turn, *, tenant_id: Any, now: Any) -> None:
    turn.status = Turn.Status.ENDED
    turn.ended_at = now
    turn.save(update_fields=["status", "ended_at"])
    event_publish(
        tenant_id=tenant_id,
        conversation_id=turn.conversation_id,
        event="turn.ended",
        data=TurnOutputSerializer(turn).data,
    )


def turn_start(*, conversation: Conversation) -> Turn:
    """Start the next turn; the active one, if any, ends first."""
    with transaction.atomic():
        locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
        now = timezone.now()
        previous = Turn.objects.filter(conversation=locked, status=Turn.Status.ACTIVE).first()
        if previous is not None:
            _end_turn(previous, tenant_id=locked.tenant_id, now=now)
        index = locked.last_turn_index + 1
        turn = Turn.objects.create(conversation=locked, index=index, started_at=now)
        Conversation.objects.filter(pk=locked.pk).update(last_turn_index=index, updated_at=now)
        event_publish(
            tenant_id=locked.tenant_id,
            conversation_id=locked.id,
            event="turn.started",
            data=TurnOutputSerializer(turn).data,
        )
    return turn


def turn_end(*, turn: Turn) -> Turn:
    """End a turn. Ending an ended turn changes nothing and sends no second event."""
    with transaction.atomic():
        locked_conversation = Conversation.objects.select_for_update().get(pk=turn.conversation_id)
        locked = Turn.objects.get(pk=turn.pk)
        if locked.status == Turn.Status.ACTIVE:
            _end_turn(locked, tenant_id=locked_conversation.tenant_id, now=timezone.now())
    return locked
