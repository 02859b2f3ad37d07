"""Transcript export and import as JSON Lines, in the shape of the compaction seed: one header line for the
conversation, then one line per message in seq order with a `uuid`/`parentUuid` chain; compaction
boundaries carry `subtype: "compact_boundary"` and summaries `isCompactSummary: true`.

Export → import → export gives the same bytes except for the ids the import assigns anew: the header's
`id` and every `uuid`/`parentUuid`. Token counts are recomputed on import, never trusted from the file."""

import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import ValidationError

from cold_storage.selectors import images_by_id
from conversations.models import Conversation, Message, Turn
from conversations.parts import iter_image_parts, parts_validate
from conversations.services import (
    default_model,
    message_name_check,
    message_size,
    message_time_check,
    message_token_count,
)
from conversations.signals import exchange_completed, transcript_imported
from conversations.tasks import message_vectors_request
from tenants.errors import ApplicationError
from tenants.models import Tenant
from tenants.services import end_user_get_or_create
from tenants.validation import HostileInput, json_loads

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
EXPORT_PAGE = 500
# The largest values the columns hold (bigint seq, integer turn index), so a file cannot overflow them.
_MAX_SEQ = 2**63 - 1
_MAX_TURN_INDEX = 2**31 - 1
_ROLES = set(Message.Role.values)
_TURN_STATUSES = set(Turn.Status.values)


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _ts(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def header_line(conversation: Conversation) -> bytes:
    turns = [
        {"index": t.index, "status": t.status, "startedAt": _ts(t.started_at), "endedAt": _ts(t.ended_at)}
        for t in conversation.turns.order_by("index")
    ]
    return _dumps(
        {
            "type": "conversation",
            "version": FORMAT_VERSION,
            "id": str(conversation.id),
            "title": conversation.title,
            "model": conversation.model,
            "endUser": conversation.end_user.external_id if conversation.end_user else None,
            "metadata": conversation.metadata,
            "createdAt": _ts(conversation.created_at),
            "archivedAt": _ts(conversation.archived_at),
            "turns": turns,
        }
    )


def message_line(message: Message, *, parent_uuid: str | None, turn_index: int | None) -> bytes:
    entry: dict[str, Any] = {"uuid": str(message.id), "parentUuid": parent_uuid}
    if message.kind == Message.Kind.COMPACT_BOUNDARY:
        entry["type"] = "system"
        entry["subtype"] = "compact_boundary"
    else:
        entry["type"] = message.role
    if message.kind == Message.Kind.COMPACT_SUMMARY:
        entry["isCompactSummary"] = True
    entry["role"] = message.role
    if message.name:
        entry["name"] = message.name
    entry["content"] = message.content
    if message.parts:
        entry["parts"] = message.parts
    entry["timestamp"] = _ts(message.created_at)
    entry["seq"] = message.seq
    if turn_index is not None:
        entry["turnIndex"] = turn_index
    entry["completed"] = message.completed
    entry["isError"] = message.is_error
    entry["tokenCount"] = message.token_count
    if message.idempotency_key is not None:
        entry["idempotencyKey"] = message.idempotency_key
    if message.metadata:
        entry["compactMetadata" if message.kind == Message.Kind.COMPACT_BOUNDARY else "metadata"] = (
            message.metadata
        )
    return _dumps(entry)


def transcript_export(conversation: Conversation) -> Iterator[bytes]:
    """The transcript as chunks of lines, read a page at a time so a 100k-message export streams in
    constant memory."""
    yield header_line(conversation)
    turn_index = dict(conversation.turns.values_list("id", "index"))
    after_seq, previous_id = 0, None
    while True:
        page = list(
            Message.objects.filter(conversation=conversation, seq__gt=after_seq).order_by("seq")[:EXPORT_PAGE]
        )
        if not page:
            return
        chunks = []
        for message in page:
            parent = str(message.parent_id) if message.parent_id else previous_id
            index = turn_index.get(message.turn_id) if message.turn_id is not None else None
            chunks.append(message_line(message, parent_uuid=parent, turn_index=index))
            previous_id = str(message.id)
        after_seq = page[-1].seq
        yield b"".join(chunks)


# --- import ------------------------------------------------------------------------------------------------


def _bad(line_no: int, message: str) -> ApplicationError:
    return ApplicationError(f"Line {line_no}: {message}", code="invalid_transcript", extra={"line": line_no})


def _parse_time(value: Any, line_no: int, field: str) -> datetime | None:
    """A time of the file, in UTC (a naive one is UTC, a date alone midnight), held to the range a client
    may give a message's created_at."""
    if value is None:
        return None
    parsed = None
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            # The seed's files carry epoch milliseconds.
            parsed = datetime.fromtimestamp(value / 1000, tz=UTC)
        elif isinstance(value, str):
            parsed = parse_datetime(value)
    except (ValueError, OverflowError, OSError):
        pass  # well-formed but impossible (month 13) or beyond what datetime holds
    if parsed is None:
        raise _bad(line_no, f"{field} is not an ISO 8601 time or epoch milliseconds.")
    try:
        return message_time_check(parsed)
    except ValueError as exc:
        raise _bad(line_no, f"{field} {exc}") from None


def _kind(entry: dict[str, Any], line_no: int) -> str:
    if entry.get("subtype") == "compact_boundary":
        return Message.Kind.COMPACT_BOUNDARY
    if "subtype" in entry:
        raise _bad(line_no, f"unknown subtype {entry['subtype']!r}.")
    if entry.get("isCompactSummary") is True:
        return Message.Kind.COMPACT_SUMMARY
    return Message.Kind.MESSAGE


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _parse_lines(data: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(data.count(b"\n", 0, exc.start) + 1, "not UTF-8.") from None
    # Lines end at \n only: str.splitlines() would also cut at U+2028, U+0085 and the like, which JSON
    # leaves unescaped inside strings (the export writes them as they are).
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            entry = json_loads(line)
        except HostileInput as exc:
            # The line's code (null_characters_not_allowed, json_too_deep…), as for a JSON body.
            where = ".".join(exc.path)
            raise ApplicationError(
                f"Line {line_no}: {where + ': ' if where else ''}{exc.message}",
                code=exc.code,
                extra={"line": line_no, **({"path": where} if where else {}), **exc.extra},
            ) from None
        except json.JSONDecodeError as exc:
            raise _bad(line_no, f"not JSON ({exc.msg}).") from None
        except ValueError as exc:  # NaN, Infinity
            raise _bad(line_no, f"not JSON ({exc}).") from None
        if not isinstance(entry, dict):
            raise _bad(line_no, "each line must be a JSON object.")
        yield line_no, entry


def transcript_import(*, tenant: Tenant, data: bytes, max_message_bytes: int) -> Conversation:
    """Create a new conversation from a JSONL transcript, all or nothing. Every line is validated before
    anything is written."""
    lines = list(_parse_lines(data))
    if not lines:
        raise _bad(1, "the transcript is empty.")
    header = _header_take(lines)
    model = header.get("model") or default_model(tenant)
    if not isinstance(model, str) or len(model) > 100:
        raise _bad(1, "model must be a string of at most 100 characters.")
    turns = _header_turns(header)
    rows = _message_rows(lines, turns=turns, max_message_bytes=max_message_bytes)
    _image_references_check(tenant, [line_no for line_no, _ in lines], rows)
    fields = _header_fields(header)
    turn_times = {index: _turn_times(turn) for index, turn in turns.items()}
    with transaction.atomic():
        conversation = _conversation_create(
            tenant,
            fields,
            model=model,
            last_seq=rows[-1]["seq"] if rows else 0,
            last_turn_index=max(turns, default=0),
        )
        turn_ids = _turns_create(conversation, turns, turn_times)
        _messages_create(conversation, rows, turn_ids, model=model)
        _background_request(conversation, rows)
    return conversation


def _background_request(conversation: Conversation, rows: list[dict[str, Any]]) -> None:
    """What an append queues, queued for the imported history too: its vectors, and the memory agent when
    it holds a completed exchange. Otherwise a client waiting on retrieval_index or the agent's `pending`
    (the documented way after an import) waited for the periodic sweeps."""
    conversation_id = conversation.pk
    transaction.on_commit(lambda: message_vectors_request(conversation_id=conversation_id), robust=True)
    transaction.on_commit(
        lambda: transcript_imported.send(sender=Conversation, conversation_id=conversation_id), robust=True
    )
    if any(row["role"] == Message.Role.ASSISTANT and row["completed"] for row in rows):
        for receiver, error in exchange_completed.send_robust(sender=Message, conversation=conversation):
            if error is not None:  # as on append: the import stands, the sweeps retry the reaction
                logger.error("exchange_completed receiver %r failed", receiver, exc_info=error)


def _header_take(lines: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """The header line, taken off the lines when the file has one (else an empty header)."""
    if lines[0][1].get("type") != "conversation":
        return {}
    line_no, header = lines.pop(0)
    if header.get("version") != FORMAT_VERSION:
        raise _bad(
            line_no, f"unsupported version {header.get('version')!r}; this server reads {FORMAT_VERSION}."
        )
    return header


def _header_turns(header: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The header's turns by index: positive unique indexes, known statuses, at most one active."""
    turns_by_index: dict[int, dict[str, Any]] = {}
    header_turns = header.get("turns") or []
    if not isinstance(header_turns, list):
        raise _bad(1, "turns must be a list.")
    for turn in header_turns:
        if (
            not isinstance(turn, dict)
            or not _is_int(turn.get("index"), 1, _MAX_TURN_INDEX)
            or not isinstance(turn.get("status"), str)
            or turn["status"] not in _TURN_STATUSES
        ):
            raise _bad(
                1, "each turn needs a positive integer index and a status of active, ended or compacted."
            )
        if turn["index"] in turns_by_index:
            raise _bad(1, f"turn index {turn['index']} appears twice.")
        turns_by_index[turn["index"]] = turn
    if sum(1 for t in turns_by_index.values() if t["status"] == Turn.Status.ACTIVE) > 1:
        raise _bad(1, "at most one turn can be active.")
    return turns_by_index


def _header_fields(header: dict[str, Any]) -> dict[str, Any]:
    """The conversation's title, metadata, end user's external id and times from the header, checked."""
    fields = {
        "created_at": _parse_time(header.get("createdAt"), 1, "createdAt"),
        "archived_at": _parse_time(header.get("archivedAt"), 1, "archivedAt"),
        "metadata": header.get("metadata") or {},
        "title": header.get("title") or "",
        "end_user": header.get("endUser"),
    }
    if (
        not isinstance(fields["metadata"], dict)
        or not isinstance(fields["title"], str)
        or len(fields["title"]) > 300
    ):
        raise _bad(1, "title must be a string (≤ 300 characters) and metadata an object.")
    end_user = fields["end_user"]
    if end_user is not None and (not isinstance(end_user, str) or not 0 < len(end_user) <= 255):
        raise _bad(1, "endUser must be a string of 1 to 255 characters.")
    return fields


def _turn_times(turn: dict[str, Any]) -> tuple[datetime | None, datetime | None]:
    return _parse_time(turn.get("startedAt"), 1, "startedAt"), _parse_time(turn.get("endedAt"), 1, "endedAt")


@dataclass
class _Chain:
    """What the lines read so far constrain the next one by: their uuids, seq and idempotency keys."""

    seen: dict[str, int] = field(default_factory=dict)
    previous_uuid: str | None = None
    seq: int = 0
    keys: set[str] = field(default_factory=set)


def _message_rows(
    lines: list[tuple[int, dict[str, Any]]], *, turns: dict[int, dict[str, Any]], max_message_bytes: int
) -> list[dict[str, Any]]:
    """One checked row per message line, in file order, ready to become a Message."""
    chain = _Chain()
    rows = []
    for line_no, entry in lines:
        file_uuid = _row_uuid(entry, line_no, chain)
        role, content, parts, metadata = _row_content(entry, line_no, max_message_bytes)
        seq, explicit_parent, turn_index = _row_position(entry, line_no, chain, turns)
        key = _row_flags(entry, line_no, chain)
        rows.append(
            {
                "file_uuid": file_uuid,
                "explicit_parent": explicit_parent,
                "turn_index": turn_index,
                "seq": seq,
                "role": role,
                "name": _row_name(entry, line_no),
                "kind": _kind(entry, line_no),
                "content": content,
                "parts": parts,
                "completed": entry.get("completed", True),
                "is_error": entry.get("isError", False),
                "idempotency_key": key,
                "metadata": metadata,
                "created_at": _parse_time(entry.get("timestamp"), line_no, "timestamp"),
            }
        )
        chain.seen[file_uuid] = line_no
        chain.previous_uuid = file_uuid
    return rows


def _row_uuid(entry: dict[str, Any], line_no: int, chain: _Chain) -> str:
    file_uuid = entry.get("uuid")
    if not isinstance(file_uuid, str) or not file_uuid:
        raise _bad(line_no, "uuid is required.")
    if file_uuid in chain.seen:
        raise _bad(line_no, f"uuid {file_uuid!r} appears twice.")
    return file_uuid


def _explicit_parent(entry: dict[str, Any], line_no: int, chain: _Chain) -> str | None:
    """The parent a line names when that is not simply the line before it."""
    parent_uuid = entry.get("parentUuid")
    if parent_uuid == chain.previous_uuid:
        return None
    if not isinstance(parent_uuid, str) or parent_uuid not in chain.seen:
        raise _bad(line_no, "parentUuid must name an earlier line (or be null on the first).")
    return parent_uuid


def _row_content(
    entry: dict[str, Any], line_no: int, max_message_bytes: int
) -> tuple[str, str, list[dict[str, Any]], dict[str, Any]]:
    """(role, content, parts, metadata) of a line, within the size a message may have."""
    role = entry.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise _bad(line_no, f"role must be one of {', '.join(sorted(_ROLES))}.")
    content = entry.get("content", "")
    if not isinstance(content, str):
        raise _bad(line_no, "content must be a string.")
    try:
        parts = parts_validate(entry.get("parts") or [])
    except ValidationError as exc:
        raise _bad(line_no, f"invalid parts: {exc.detail}") from None
    metadata = (
        entry.get("compactMetadata" if entry.get("subtype") == "compact_boundary" else "metadata") or {}
    )
    if not isinstance(metadata, dict):
        raise _bad(line_no, "metadata must be an object.")
    if message_size(content, parts, metadata) > max_message_bytes:
        raise _bad(line_no, f"the message is larger than {max_message_bytes} bytes.")
    return role, content, parts, metadata


def _row_name(entry: dict[str, Any], line_no: int) -> str:
    """The line's speaker, held to what the API takes ("" when the line names none)."""
    try:
        return message_name_check(entry.get("name"))
    except ValueError as exc:
        raise _bad(line_no, f"name {exc}") from None


def _row_position(
    entry: dict[str, Any], line_no: int, chain: _Chain, turns: dict[int, dict[str, Any]]
) -> tuple[int, str | None, int | None]:
    """(seq, explicit parent, turn index) of a line: seq strictly increasing (the next one when absent), the
    parent an earlier line, the turn one of the header's."""
    line_seq = entry.get("seq")
    if line_seq is None:
        line_seq = chain.seq + 1
    if not _is_int(line_seq, chain.seq + 1, _MAX_SEQ):
        raise _bad(line_no, f"seq must be an integer larger than the previous line's, at most {_MAX_SEQ}.")
    chain.seq = line_seq
    explicit_parent = _explicit_parent(entry, line_no, chain)
    turn_index = entry.get("turnIndex")
    if turn_index is not None and not (_is_int(turn_index, 1, _MAX_TURN_INDEX) and turn_index in turns):
        raise _bad(line_no, f"turnIndex {turn_index!r} is not a turn of the header.")
    return line_seq, explicit_parent, turn_index


def _row_flags(entry: dict[str, Any], line_no: int, chain: _Chain) -> str | None:
    """The line's idempotency key (unique in the file), after checking its completed/isError flags."""
    key = entry.get("idempotencyKey")
    if key is not None:
        if not isinstance(key, str) or len(key) > 255 or key in chain.keys:
            raise _bad(line_no, "idempotencyKey must be a unique string of at most 255 characters.")
        chain.keys.add(key)
    for flag in ("completed", "isError"):
        if flag in entry and not isinstance(entry[flag], bool):
            raise _bad(line_no, f"{flag} must be true or false.")
    return key


def _image_references(parts: list[dict[str, Any]]) -> Iterator[tuple[int, str]]:
    """(index of the top-level part, image id) for every image a message's parts name, those inside a tool
    result's content included."""
    for index, part in enumerate(parts):
        for image in iter_image_parts([part]):
            for name in ("image_id", "duplicate_of"):
                if name in image:
                    yield index, image[name]


def _image_references_check(tenant: Tenant, line_numbers: list[int], rows: list[dict[str, Any]]) -> None:
    """Every image a line names must be an image of the importing tenant, as on append: otherwise the token
    count stored with the message would tell whether another tenant's image exists, and its size."""
    named = [
        (line_no, ref)
        for line_no, row in zip(line_numbers, rows, strict=True)
        for ref in _image_references(row["parts"])
    ]
    found = images_by_id(tenant_id=tenant.pk, image_ids={image_id for _, (_, image_id) in named})
    for line_no, (index, image_id) in named:
        if image_id not in found:
            raise ApplicationError(
                f"Line {line_no}: part {index} names no image of your tenant ({image_id}).",
                code="invalid_image",
                extra={"line": line_no, "index": index, "reason": "unknown_image_id", "image_id": image_id},
            )


def _conversation_create(
    tenant: Tenant, fields: dict[str, Any], *, model: str, last_seq: int, last_turn_index: int
) -> Conversation:
    external_id = fields["end_user"]
    created_at = fields["created_at"]
    return Conversation.objects.create(
        tenant=tenant,
        end_user=end_user_get_or_create(tenant=tenant, external_id=external_id) if external_id else None,
        model=model,
        title=fields["title"],
        metadata=fields["metadata"],
        last_seq=last_seq,
        last_turn_index=last_turn_index,
        archived_at=fields["archived_at"],
        **({"created_at": created_at, "updated_at": created_at} if created_at else {}),
    )


def _turns_create(
    conversation: Conversation,
    turns: dict[int, dict[str, Any]],
    times: dict[int, tuple[datetime | None, datetime | None]],
) -> dict[int, uuid.UUID]:
    """The header's turns as rows: turn index -> id."""
    turn_ids: dict[int, uuid.UUID] = {}
    for index, turn in sorted(turns.items()):
        started, ended = times[index]
        created = Turn.objects.create(
            conversation=conversation,
            index=index,
            status=turn["status"],
            ended_at=ended,
            **({"started_at": started} if started else {}),
        )
        turn_ids[index] = created.id
    return turn_ids


def _messages_create(
    conversation: Conversation, rows: list[dict[str, Any]], turn_ids: dict[int, uuid.UUID], *, model: str
) -> None:
    """The rows as messages with new ids (the file's uuids mapped to them), token counts computed anew."""
    new_ids = {row["file_uuid"]: uuid.uuid4() for row in rows}
    messages = []
    for row in rows:
        extra = {"created_at": row["created_at"]} if row["created_at"] else {}
        messages.append(
            Message(
                id=new_ids[row["file_uuid"]],
                conversation=conversation,
                seq=row["seq"],
                turn_id=turn_ids.get(row["turn_index"]) if row["turn_index"] is not None else None,
                parent_id=new_ids[row["explicit_parent"]] if row["explicit_parent"] else None,
                role=row["role"],
                name=row["name"],
                kind=row["kind"],
                content=row["content"],
                parts=row["parts"],
                completed=row["completed"],
                is_error=row["is_error"],
                idempotency_key=row["idempotency_key"],
                metadata=row["metadata"],
                token_count=message_token_count(
                    role=row["role"],
                    content=row["content"],
                    parts=row["parts"],
                    tenant_id=conversation.tenant_id,
                    model=model,
                    name=row["name"],
                ),
                **extra,
            )
        )
    Message.objects.bulk_create(messages, batch_size=1000)
