"""An append's items made ready before the lock is taken: each checked (name, time, size, usage), its new
images validated and hashed, its tokens counted; and the idempotency keys of the batch settled. Decoding
and tokenising are the slow parts, so none of this waits on the conversation's row lock."""

from datetime import datetime
from typing import Any

from django.conf import settings

from conversations import visual
from conversations.models import Message
from conversations.parts import parts_text
from conversations.services.checks import message_name_check, message_size, message_time_check
from conversations.tokens import message_text_token_count, message_token_count
from tenants.errors import ApplicationError


def items_prepare(
    items: list[dict[str, Any]],
    keys: list[str | None],
    *,
    tenant_id: Any,
    model: str,
    uploads: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """One prepared row per item, in order, each carrying the idempotency key settled for it."""
    prepared = []
    for index, (item, key) in enumerate(zip(items, keys, strict=True)):
        row = _prepare(item, index=index, tenant_id=tenant_id, model=model, uploads=uploads)
        row["idempotency_key"] = key
        prepared.append(row)
    return prepared


def _prepare(
    item: dict[str, Any], *, index: int, tenant_id: Any, model: str, uploads: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Normalise one validated message, validate and hash its new images, and count its tokens."""
    name = _name(item.get("name"), index)
    parts = item.get("parts") or []
    content = item.get("content")
    if content is None:
        content = parts_text(parts)
    parts, images = visual.intake_prepare(
        parts, index=index, is_error=item.get("is_error", False), uploads=uploads
    )
    completed = item.get("completed", True)
    if not content and not parts and completed:
        raise ApplicationError(
            f"Message {index} is empty: give content or parts "
            "(or completed=false for a reply still streaming).",
            code="empty_message",
            extra={"index": index},
        )
    # Image bytes are stored apart from the message, so they do not count against its size.
    _check_size(
        content, visual.parts_without_payload(parts) if images.pending else parts, item.get("metadata"), index
    )
    created_at = _created_at(item.get("created_at"), index)
    role = item["role"]
    return {
        "usage": _usage(item.get("usage"), role, index),
        "role": role,
        "name": name,
        "kind": item.get("kind", Message.Kind.MESSAGE),
        "content": content,
        "parts": parts,
        "completed": completed,
        "is_error": item.get("is_error", False),
        "metadata": item.get("metadata") or {},
        "idempotency_key": item.get("idempotency_key"),
        "turn_id": item.get("turn_id"),
        "parent_id": item.get("parent_id"),
        # None: the server's now at write time.
        "created_at": created_at,
        "token_count": _token_count(
            role=role,
            content=content,
            parts=parts,
            name=name,
            tenant_id=tenant_id,
            model=model,
            images=images,
        ),
        "images": images,
    }


def _token_count(
    *,
    role: str,
    content: str,
    parts: list[dict[str, Any]],
    name: str,
    tenant_id: Any,
    model: str,
    images: visual.MessageImages,
) -> int:
    # With new images the text is counted here and the images once they are stored (dedup decides).
    if images.has_new:
        return message_text_token_count(role=role, content=content, parts=parts, model=model, name=name)
    return message_token_count(
        role=role, content=content, parts=parts, tenant_id=tenant_id, model=model, name=name
    )


def _check_size(
    content: str, parts: list[dict[str, Any]], metadata: dict[str, Any] | None, index: int
) -> None:
    size = message_size(content, parts, metadata)
    if size > settings.MNEMO_MAX_MESSAGE_BYTES:
        raise ApplicationError(
            f"Message {index} is {size} bytes; the limit is {settings.MNEMO_MAX_MESSAGE_BYTES}.",
            code="message_too_large",
            extra={"index": index, "size_bytes": size, "limit_bytes": settings.MNEMO_MAX_MESSAGE_BYTES},
        )


def _created_at(created_at: datetime | None, index: int) -> datetime | None:
    """The client's created_at, checked against the allowed range, or None."""
    if created_at is None:
        return None
    try:
        return message_time_check(created_at)
    except ValueError as exc:
        raise ApplicationError(
            f"Message {index}: created_at {exc}", code="created_at_out_of_range", extra={"index": index}
        ) from None


def _usage(usage: dict[str, Any] | None, role: str, index: int) -> dict[str, Any] | None:
    if usage is not None and role != Message.Role.ASSISTANT:
        raise ApplicationError(
            f"Message {index}: usage belongs on assistant messages.",
            code="usage_not_allowed",
            extra={"index": index},
        )
    return usage


def _name(name: Any, index: int) -> str:
    """The item's speaker, checked (the API's serializer checks it first; other callers reach here)."""
    try:
        return message_name_check(name)
    except ValueError as exc:
        raise ApplicationError(
            f"Message {index}: name {exc}", code="invalid_name", extra={"index": index}
        ) from None


def idempotency_keys(items: list[dict[str, Any]], header_key: str | None) -> list[str | None]:
    """The key of each item: its own, or one derived from the request's Idempotency-Key header (which must
    agree with it); no two items of a batch share one."""
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


def batch_check(items: list[dict[str, Any]]) -> None:
    """A batch holds at least one message and at most MNEMO_MAX_BATCH_MESSAGES."""
    if not items:
        raise ApplicationError("No messages given.", code="empty_batch")
    if len(items) > settings.MNEMO_MAX_BATCH_MESSAGES:
        raise ApplicationError(
            f"A batch holds at most {settings.MNEMO_MAX_BATCH_MESSAGES} messages.",
            code="batch_too_large",
            extra={"limit": settings.MNEMO_MAX_BATCH_MESSAGES, "given": len(items)},
        )


# Keys of a prepared row that are not columns of the message (or are set from elsewhere).
_NOT_COLUMNS = ("usage", "turn_id", "images", "created_at")


def message_of_row(
    conversation_id: Any, row: dict[str, Any], *, seq: int, turn_id: Any, now: datetime
) -> Message:
    """The unsaved message of a prepared row: the client's created_at, or now."""
    columns = {k: v for k, v in row.items() if k not in _NOT_COLUMNS}
    return Message(
        conversation_id=conversation_id,
        seq=seq,
        turn_id=turn_id,
        created_at=row["created_at"] or now,
        **columns,
    )
