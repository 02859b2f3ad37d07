"""Writes to conversations, turns and messages. `seq` and turn indexes are assigned under a row lock on
the conversation, so concurrent writers (threads, processes, hosts) never gap or collide."""

import contextlib
import dataclasses
import functools
import json
import logging
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.http import Http404
from django.utils import timezone
from rest_framework import status

from cold_storage.services import image_policy, images_delete_for_conversation
from conversations import visual
from conversations.embedding import message_vectors_request
from conversations.events import event_publish
from conversations.models import Conversation, Message, Turn
from conversations.parts import parts_text, parts_token_text
from conversations.serializers import MessageOutputSerializer, TurnOutputSerializer
from conversations.signals import assistant_usage_reported, exchange_completed
from providers.tokens import count_message
from tenants.errors import ApplicationError
from tenants.models import Tenant
from tenants.services import end_user_get_or_create
from tenants.settings_schema import tenant_setting

logger = logging.getLogger(__name__)


def default_model(tenant: Tenant) -> str:
    # A stored value the settings schema refuses (not text, a NUL) is not a model: the server default applies.
    return tenant_setting(tenant.settings, "default_model") or settings.MNEMO_DEFAULT_MODEL


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
    # The image rows go now, their bytes when this transaction commits.
    images_delete_for_conversation(conversation_id=conversation.id)
    conversation.delete()


# --- messages ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppendResult:
    message: Message
    created: bool


# When a client may say a message was written: not before the Unix epoch, and at most a day ahead of the
# server's clock (time zones and skew), so a mistyped year cannot date a message 2204 or 0024.
MESSAGE_TIME_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
MESSAGE_TIME_AHEAD = timedelta(days=1)


def message_time_check(value: datetime) -> datetime:
    """A client's time for a message, in UTC (a naive time is taken as UTC). ValueError, with a sentence a
    client can read, when it lies outside the range above."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    # Compared before converting: near datetime's limits the conversion itself would overflow.
    if value < MESSAGE_TIME_EARLIEST:
        raise ValueError("must not be before 1970-01-01T00:00:00Z.")
    if value > timezone.now() + MESSAGE_TIME_AHEAD:
        raise ValueError("must not be more than a day in the future.")
    return value.astimezone(UTC)


def message_size(content: str, parts: list[dict[str, Any]], metadata: dict[str, Any] | None = None) -> int:
    """Bytes a message stores: its content, parts and metadata (UTF-8, compact JSON), what
    MNEMO_MAX_MESSAGE_BYTES limits."""
    size = len(content.encode())
    for value in (parts, metadata):
        if value:
            size += len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    return size


def _text_token_count(
    *, role: str, content: str, parts: list[dict[str, Any]], model: str, name: str = ""
) -> int:
    return count_message(
        role=role, content=content, name=name or None, model=model, extra_text=parts_token_text(parts)
    )


def message_token_count(
    *, role: str, content: str, parts: list[dict[str, Any]], tenant_id: Any, model: str, name: str = ""
) -> int:
    """Tokens of a message as the model sees it, its speaker's name and images included (by the model's
    provider rule; a duplicate or a compacted image costs its one line of text). Images are looked up in the
    tenant only."""
    text = _text_token_count(role=role, content=content, parts=parts, model=model, name=name)
    return text + visual.parts_image_tokens(parts, tenant_id=tenant_id, model=model)


# The column's length, as sent: the schema's maxLength is the input's (tenants.api.StrictSerializer).
MESSAGE_NAME_MAX = cast(int, Message._meta.get_field("name").max_length)
# Unicode categories a speaker's name must not hold: control and format characters (bidi overrides, zero
# widths, which make two names look alike), surrogates, and line or paragraph separators, which would
# break the one-line labels names are shown in.
_NAME_REFUSED_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def message_name_check(value: Any) -> str:
    """A speaker's name as stored: trimmed, "" for none (absent, null, empty or blank). ValueError, with a
    sentence a client can read, when it is not a string, is longer than the column as sent, or holds a
    control character."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError("must be a string.")
    if len(value) > MESSAGE_NAME_MAX:
        raise ValueError(f"must be at most {MESSAGE_NAME_MAX} characters.")
    for char in value:
        if unicodedata.category(char) in _NAME_REFUSED_CATEGORIES:
            raise ValueError(f"must not contain control characters (found U+{ord(char):04X}).")
    return value.strip()


def _prepare(
    item: dict[str, Any], *, index: int, tenant_id: Any, model: str, uploads: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Normalise one validated message, validate and hash its new images, and count its tokens (outside
    the lock: decoding and tokenising are the slow parts)."""
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
        # With new images the text is counted here and the images once they are stored (dedup decides).
        "token_count": (
            _text_token_count(role=role, content=content, parts=parts, model=model, name=name)
            if images.has_new
            else message_token_count(
                role=role, content=content, parts=parts, tenant_id=tenant_id, model=model, name=name
            )
        ),
        "images": images,
    }


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


def _same_message(existing: Message, prepared: dict[str, Any], *, tenant_id: Any) -> bool:
    # What the message says, and who says it, is compared; its metadata, flags and created_at are not: a
    # client that stamps each retry with its own clock is still sending the same message, and gets the
    # original back.
    if existing.role != prepared["role"] or existing.kind != prepared["kind"]:
        return False
    if existing.name != prepared["name"]:
        return False
    if existing.content != prepared["content"]:
        return False
    if not prepared["images"].pending:
        return existing.parts == prepared["parts"]
    return visual.comparable_parts(existing.parts, tenant_id=tenant_id) == visual.comparable_parts(
        prepared["parts"], tenant_id=tenant_id, pending=prepared["images"]
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


def _lock_for_append(conversation: Conversation) -> Conversation:
    """The conversation row, locked until the transaction ends: every seq is assigned under this lock."""
    return (
        Conversation.objects.select_for_update().only("id", "last_seq", "tenant_id").get(pk=conversation.pk)
    )


def message_append_batch(
    *,
    conversation: Conversation,
    items: list[dict[str, Any]],
    idempotency_key: str | None = None,
    uploads: dict[str, Any] | None = None,
) -> list[AppendResult]:
    """Append messages in order, all or nothing. A message whose idempotency key was seen before is not
    written again: its original is returned (created=False); the same key with different content is a 409.
    Image parts are validated before anything is written and stored with their message (``uploads`` holds
    the multipart files that parts name with "upload"); a refused batch leaves no row and no file."""
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
        row = _prepare(
            item, index=index, tenant_id=conversation.tenant_id, model=conversation.model, uploads=uploads
        )
        row["idempotency_key"] = key
        prepared.append(row)
    intake = None
    if any(row["images"].pending for row in prepared):
        visual.references_check(tenant_id=conversation.tenant_id, batch=[row["images"] for row in prepared])
        intake = visual.IntakeState(
            tenant_id=conversation.tenant_id,
            conversation_id=conversation.pk,
            policy=image_policy(conversation.tenant.settings),
        )
    if intake is None and len(prepared) == 1 and _fits_one_statement(prepared[0]):
        message = _append_in_one_statement(conversation, prepared[0])
        if message is not None:
            return [AppendResult(message, created=True)]
    try:
        return _append_locked(conversation, prepared, keys, intake)
    except BaseException:
        if intake is not None:
            intake.blobs.discard()  # the rows rolled back; their files must not stay behind
        raise


def _reserve_seqs(conversation: Conversation, count: int, now: Any) -> int:
    """Lock the conversation row and move last_seq past `count` new messages in one statement (the lock
    and the counter in one round trip: appends are the hottest write). Returns the seq before them."""
    quote = connection.ops.quote_name
    table = quote(Conversation._meta.db_table)
    pk = Conversation._meta.pk.get_db_prep_value(conversation.pk, connection)
    stamp = Conversation._meta.get_field("updated_at").get_db_prep_value(now, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            # Table and column names come from the models; every value is a parameter.
            f"UPDATE {table} SET {quote('last_seq')} = {quote('last_seq')} + %s, "  # noqa: S608
            f"{quote('updated_at')} = %s WHERE {quote('id')} = %s RETURNING {quote('last_seq')}",
            [count, stamp, pk],
        )
        row = cursor.fetchone()
    if row is None:  # deleted since the request fetched it
        raise Http404
    return row[0] - count


def _append_context(conversation: Conversation, keys: list[str]) -> tuple[Any, bool]:
    """The active turn and whether any of the keys was used before, read in one statement under the lock
    (after it, so a writer we waited for is seen)."""
    quote = connection.ops.quote_name
    pk = Conversation._meta.pk.get_db_prep_value(conversation.pk, connection)
    turns, messages = quote(Turn._meta.db_table), quote(Message._meta.db_table)
    seen = "0"
    params: list[Any] = [pk, Turn.Status.ACTIVE]
    if keys:
        seen = (
            f"(SELECT COUNT(*) FROM {messages} WHERE {quote('conversation_id')} = %s "  # noqa: S608
            f"AND {quote('idempotency_key')} IN ({', '.join(['%s'] * len(keys))}))"
        )
        params += [pk, *keys]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (SELECT {quote('id')} FROM {turns} WHERE {quote('conversation_id')} = %s "  # noqa: S608
            f"AND {quote('status')} = %s ORDER BY {quote('index')} DESC LIMIT 1), {seen}",
            params,
        )
        turn_id, seen_count = cursor.fetchone()
    return (Turn._meta.pk.to_python(turn_id) if turn_id is not None else None), bool(seen_count)


def _fits_one_statement(row: dict[str, Any]) -> bool:
    """A plain message (the common append): no images to store, no turn or parent to check, no usage."""
    return (
        connection.vendor == "postgresql"
        and row["turn_id"] is None
        and row["parent_id"] is None
        and row["usage"] is None
    )


@functools.cache
def _one_statement_sql(with_key: bool) -> str:
    """The one-statement append. Parameters: updated_at, the conversation (twice more with the key and the
    key), then one per message column in _meta order, seq excepted, the conversation in turn_id's place."""
    quote = connection.ops.quote_name
    conversations, messages = quote(Conversation._meta.db_table), quote(Message._meta.db_table)
    fields = Message._meta.concrete_fields
    values = {"seq": "reserved.last_seq", "turn_id": "mnemo_active_turn(%s)"}
    unused = (
        f" AND NOT EXISTS (SELECT 1 FROM {messages} WHERE {quote('conversation_id')} = %s "  # noqa: S608
        f"AND {quote('idempotency_key')} = %s)"
        if with_key
        else ""
    )
    return (
        f"WITH reserved AS (UPDATE {conversations} SET {quote('last_seq')} = {quote('last_seq')} + 1, "  # noqa: S608
        f"{quote('updated_at')} = %s WHERE {quote('id')} = %s{unused} RETURNING {quote('last_seq')}) "
        f"INSERT INTO {messages} ({', '.join(quote(f.column) for f in fields)}) "
        f"SELECT {', '.join(values.get(f.attname, '%s') for f in fields)} FROM reserved "
        f"RETURNING {quote('seq')}, {quote('turn_id')}"
    )


def _append_in_one_statement(conversation: Conversation, row: dict[str, Any]) -> Message | None:
    """PostgreSQL, one plain message: the seq reservation (which takes the conversation's row lock), the
    active turn and the insert in one statement, so an append is one round trip instead of five (BEGIN,
    lock, lookups, insert, COMMIT), the same writes as _append_locked. The active turn comes from
    mnemo_active_turn() (migration 0004), which reads after the lock is held, as _append_context does.

    None when the statement wrote nothing, and the caller takes the locked path, which answers each case:
    the key was used before (a replay), the conversation is gone, or a concurrent writer used the same key
    first (the unique constraint refused the insert, and the statement's update went with it).

    Kept because a benchmark shows it pays: measured in-process, that step alone took server CPU per append
    from 2.95 to 2.2 ms and database CPU from 0.73 to 0.50 ms (commit 71c868f), one of the changes that took
    bench/append.py's PG+Redis granian row from 288 to 434 appends/s (docs/benchmarks.md, Appends over
    HTTP). Without that margin it goes back to the plain locked path."""
    now = timezone.now()
    message = Message(
        conversation_id=conversation.pk,
        seq=0,
        created_at=row["created_at"] or now,
        **{k: v for k, v in row.items() if k not in ("usage", "turn_id", "images", "created_at")},
    )
    key = message.idempotency_key
    pk = Conversation._meta.pk.get_db_prep_value(conversation.pk, connection)
    # The conversation changed now, whenever the client says the message was written.
    stamp = Conversation._meta.get_field("updated_at").get_db_prep_value(now, connection)
    params: list[Any] = [stamp, pk] + ([pk, key] if key is not None else [])
    for field in Message._meta.concrete_fields:
        if field.attname == "turn_id":
            params.append(pk)  # mnemo_active_turn's argument
        elif field.attname != "seq":
            params.append(field.get_db_prep_save(getattr(message, field.attname), connection))
    # Inside a caller's transaction, a refused statement must not abort it: a savepoint takes the error.
    guard = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
    try:
        with guard, connection.cursor() as cursor:
            cursor.execute(_one_statement_sql(key is not None), params)
            found = cursor.fetchone()
    except IntegrityError:
        return None
    if found is None:
        return None
    message.seq, message.turn_id = found
    message._state.adding = False
    message._state.db = connection.alias
    conversation.last_seq = message.seq
    _announce(conversation, [message], committed=not connection.in_atomic_block)
    return message


def _announce(conversation: Conversation, created: list[Message], *, committed: bool = False) -> None:
    """After new messages are written: the memory agent's trigger and the sockets' events (both leave when
    the transaction commits). Once the write is committed a failing receiver is logged, not raised: the
    stored append must not answer 500 (the next completed exchange triggers the memory agent again)."""
    if any(m.role == Message.Role.ASSISTANT and m.completed for m in created):
        if committed:
            for receiver, error in exchange_completed.send_robust(sender=Message, conversation=conversation):
                if isinstance(error, Exception):
                    logger.error("exchange_completed receiver %r failed", receiver, exc_info=error)
        else:
            exchange_completed.send(sender=Message, conversation=conversation)
    _publish_appended(conversation, created)
    transaction.on_commit(lambda: message_vectors_request(conversation_id=conversation.pk), robust=True)


def _publish_appended(conversation: Conversation, messages: list[Message]) -> None:
    for message in messages:
        event_publish(
            tenant_id=conversation.tenant_id,
            conversation_id=conversation.pk,
            event="message.appended",
            data=MessageOutputSerializer(message).data,
        )


def _append_locked(
    conversation: Conversation,
    prepared: list[dict[str, Any]],
    keys: list[str | None],
    intake: visual.IntakeState | None,
) -> list[AppendResult]:
    """The batch under the conversation's row lock: reserve its seqs, read what it refers to (replayed
    keys, named turns, parents), build each new message (a replay returns its original), then write them
    and announce them on commit. A batch of replays only writes nothing."""
    with transaction.atomic():
        now = timezone.now()
        first_seq = _reserve_seqs(conversation, len(prepared), now)
        present_keys = [k for k in keys if k is not None]
        active_turn_id, any_seen = _append_context(conversation, present_keys)
        existing = _messages_by_key(conversation, present_keys) if any_seen else {}
        turns = _turns_named(conversation, prepared)
        _parents_check(conversation, prepared)
        batch = _Batch(seq=first_seq)
        for index, row in enumerate(prepared):
            replayed = _replay_of(existing, row, index, tenant_id=conversation.tenant_id)
            if replayed is not None:
                batch.results.append(AppendResult(replayed, created=False))
                continue
            turn_id = _turn_for(row.pop("turn_id"), turns, index=index, active_turn_id=active_turn_id)
            batch.seq += 1
            message, usage = _message_build(
                conversation, row, seq=batch.seq, turn_id=turn_id, now=now, intake=intake
            )
            batch.add(message, usage)
        if not batch.created:
            # Only replays: undo the reservation (and the updated_at it touched).
            transaction.set_rollback(True)
        else:
            _batch_write(conversation, batch, reserved_up_to=first_seq + len(prepared))
    conversation.last_seq = batch.seq
    return batch.results


@dataclass
class _Batch:
    """What an append under the lock has decided so far: the last seq given, the result of each item in
    order, the messages to create and the provider usage reported with them."""

    seq: int
    results: list[AppendResult] = dataclasses.field(default_factory=list)
    created: list[Message] = dataclasses.field(default_factory=list)
    usages: list[tuple[Message, dict[str, Any]]] = dataclasses.field(default_factory=list)

    def add(self, message: Message, usage: dict[str, Any] | None) -> None:
        self.created.append(message)
        self.results.append(AppendResult(message, created=True))
        if usage is not None:
            self.usages.append((message, usage))


def _messages_by_key(conversation: Conversation, keys: list[str]) -> dict[str, Message]:
    """The messages already stored under these idempotency keys."""
    return {
        m.idempotency_key: m
        for m in Message.objects.filter(conversation=conversation, idempotency_key__in=keys)
    }


def _turns_named(conversation: Conversation, prepared: list[dict[str, Any]]) -> dict[Any, Turn]:
    """The turns of this conversation the batch names (one that names another's is missing here)."""
    turn_ids = {row["turn_id"] for row in prepared if row["turn_id"] is not None}
    if not turn_ids:
        return {}
    return {t.id: t for t in Turn.objects.filter(conversation=conversation, id__in=turn_ids)}


def _parents_check(conversation: Conversation, prepared: list[dict[str, Any]]) -> None:
    """Each parent_id of the batch names a message of this conversation."""
    parent_ids = {row["parent_id"] for row in prepared if row["parent_id"] is not None}
    if not parent_ids:
        return
    found = set(
        Message.objects.filter(conversation=conversation, id__in=parent_ids).values_list("id", flat=True)
    )
    if parent_ids - found:
        raise ApplicationError(
            "parent_id must name an earlier message of this conversation.", code="invalid_parent"
        )


def _replay_of(
    existing: dict[str, Message], row: dict[str, Any], index: int, *, tenant_id: Any
) -> Message | None:
    """The stored original of an item whose idempotency key was seen before (409 when it differs)."""
    key = row["idempotency_key"]
    if key is None or key not in existing:
        return None
    if not _same_message(existing[key], row, tenant_id=tenant_id):
        raise ApplicationError(
            "This idempotency key was used for a different message.",
            code="idempotency_conflict",
            status_code=status.HTTP_409_CONFLICT,
            extra={"index": index, "message_id": str(existing[key].id)},
        )
    return existing[key]


def _turn_for(turn_id: Any, turns: dict[Any, Turn], *, index: int, active_turn_id: Any) -> Any:
    """The turn a new message joins: the one it names, which must be active, else the active one (if any)."""
    if turn_id is None:
        return active_turn_id
    turn = turns.get(turn_id)
    if turn is None:
        raise ApplicationError(
            "turn_id does not name a turn of this conversation.", code="invalid_turn", extra={"index": index}
        )
    if turn.status != Turn.Status.ACTIVE:
        raise ApplicationError(
            "That turn has ended; start a new turn to add messages.",
            code="turn_ended",
            status_code=status.HTTP_409_CONFLICT,
            extra={"index": index, "turn_id": str(turn_id)},
        )
    return turn_id


def _message_build(
    conversation: Conversation,
    row: dict[str, Any],
    *,
    seq: int,
    turn_id: Any,
    now: datetime,
    intake: visual.IntakeState | None,
) -> tuple[Message, dict[str, Any] | None]:
    """(the unsaved message of a prepared row, with its new images stored; the usage reported with it)."""
    usage = row.pop("usage")
    images = row.pop("images")
    created_at = row.pop("created_at") or now
    message = Message(conversation_id=conversation.pk, seq=seq, turn_id=turn_id, created_at=created_at, **row)
    if intake is not None and images.has_new:
        message.token_count += visual.intake_store(
            state=intake, message=message, message_images=images, model=conversation.model
        )
    return message, usage


def _batch_write(conversation: Conversation, batch: _Batch, *, reserved_up_to: int) -> None:
    """Create the batch's messages, give back the seqs reserved for replays, pass on the usage reported with
    them and announce them (on commit)."""
    Message.objects.bulk_create(batch.created)
    if batch.seq != reserved_up_to:  # some were replays: give back their seqs
        Conversation.objects.filter(pk=conversation.pk).update(last_seq=batch.seq)
    for message, usage in batch.usages:
        assistant_usage_reported.send(sender=Message, conversation=conversation, message=message, usage=usage)
    _announce(conversation, batch.created)


def compaction_records_append(
    *,
    conversation: Conversation,
    records: list[dict[str, Any]],
    check: Callable[[Conversation], None] | None = None,
) -> list[Message]:
    """Append compaction records (a compact_boundary and its compact_summary messages) at the end of the
    transcript, under the same row lock as message_append_batch. `check` runs with the lock held, before
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
            messages.append(
                Message(
                    conversation_id=locked.id,
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
            )
        Message.objects.bulk_create(messages)
        Conversation.objects.filter(pk=locked.pk).update(last_seq=seq, updated_at=now)
        _publish_appended(locked, messages)
    conversation.last_seq = seq
    return messages


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
        if changes_text or metadata is not None:
            new_parts = parts if parts is not None else locked.parts
            new_content = content if content is not None else locked.content
            size = message_size(new_content, new_parts, metadata if metadata is not None else locked.metadata)
            if size > settings.MNEMO_MAX_MESSAGE_BYTES:
                raise ApplicationError(
                    f"The message would be {size} bytes; the limit is {settings.MNEMO_MAX_MESSAGE_BYTES}.",
                    code="message_too_large",
                    extra={"size_bytes": size, "limit_bytes": settings.MNEMO_MAX_MESSAGE_BYTES},
                )
        if changes_text:
            if parts is not None:
                visual.parts_check_references(parts, tenant_id=locked.conversation.tenant_id)
            locked.content, locked.parts = new_content, new_parts
            locked.token_count = message_token_count(
                role=locked.role,
                content=new_content,
                parts=new_parts,
                tenant_id=locked.conversation.tenant_id,
                model=locked.conversation.model,
                name=locked.name,
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
            if "completed" in fields and locked.completed and locked.role == Message.Role.ASSISTANT:
                exchange_completed.send(sender=Message, conversation=locked.conversation)
            event_publish(
                tenant_id=locked.conversation.tenant_id,
                conversation_id=locked.conversation_id,
                event="message.updated",
                data=MessageOutputSerializer(locked).data,
            )
    return locked


# --- turns -------------------------------------------------------------------------------------------------


def _end_turn(turn: Turn, *, tenant_id: Any, now: Any, model: str) -> None:
    """End the turn and compact its images (under the conversation's row lock, so once)."""
    turn.status = Turn.Status.ENDED
    turn.ended_at = now
    turn.save(update_fields=["status", "ended_at"])
    event_publish(
        tenant_id=tenant_id,
        conversation_id=turn.conversation_id,
        event="turn.ended",
        data=TurnOutputSerializer(turn).data,
    )
    compaction = visual.turn_compact(turn=turn, model=model, now=now)
    if compaction is not None:
        event_publish(
            tenant_id=tenant_id,
            conversation_id=turn.conversation_id,
            event="turn.compacted",
            data={"turn": TurnOutputSerializer(turn).data, **compaction.as_dict()},
        )


def turn_start(*, conversation: Conversation) -> Turn:
    """Start the next turn; the active one, if any, ends first."""
    with transaction.atomic():
        locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
        now = timezone.now()
        previous = Turn.objects.filter(conversation=locked, status=Turn.Status.ACTIVE).first()
        if previous is not None:
            _end_turn(previous, tenant_id=locked.tenant_id, now=now, model=locked.model)
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
            _end_turn(
                locked,
                tenant_id=locked_conversation.tenant_id,
                now=timezone.now(),
                model=locked_conversation.model,
            )
    return locked
