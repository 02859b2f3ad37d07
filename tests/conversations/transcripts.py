"""Helpers of the transcript tests: the export and import calls, a message written as compaction writes it,
the builders of a conversation that holds everything a transcript carries, and a snapshot to compare."""

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from conversations.models import Conversation, Message, Turn
from conversations.services import message_token_count
from tests.factories import ArchivedImageFactory

IMPORT_URL = "/api/v1/conversations/import"
NDJSON = "application/x-ndjson"


def iso(value: datetime | None) -> str | None:
    """A time as the export writes it: UTC, microseconds, a Z."""
    return None if value is None else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def export_url(conversation_id: Any) -> str:
    return f"/api/v1/conversations/{conversation_id}/transcript.jsonl"


def read_stream(response) -> bytes:
    """The body of a streamed response."""
    assert response.streaming
    return b"".join(response.streaming_content)


def export(client, conversation_id: Any) -> bytes:
    response = client.get(export_url(conversation_id))
    assert response.status_code == 200, response
    assert response["Content-Type"] == "application/x-ndjson; charset=utf-8"
    return read_stream(response)


def import_transcript(client, body: bytes):
    return client.post(IMPORT_URL, data=body, content_type=NDJSON)


def lines_of(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.splitlines()]


def orm_append(conversation: Conversation, *, role: str, kind: str, content: str, metadata: dict) -> Message:
    """What compaction will write (it is not built yet): a message straight into the transcript, with the
    token count the write path would compute."""
    conversation.refresh_from_db(fields=["last_seq"])
    seq = conversation.last_seq + 1
    message = Message.objects.create(
        conversation=conversation,
        seq=seq,
        role=role,
        kind=kind,
        content=content,
        metadata=metadata,
        token_count=message_token_count(
            role=role, content=content, parts=[], tenant_id=conversation.tenant_id, model=conversation.model
        ),
    )
    Conversation.objects.filter(pk=conversation.pk).update(last_seq=seq)
    return message


def rich_conversation(owner) -> tuple[Conversation, Callable[..., dict]]:
    """An archived-to-be conversation of the owner's with an end user, a title with a non-ASCII character
    and nested metadata; and a poster of its API paths (asserting the status)."""
    ArchivedImageFactory(tenant=owner.tenant, id="img_abc123")
    created = owner.client.post(
        "/api/v1/conversations",
        {
            "end_user": "alice",
            "title": "Round trip ✓",
            "model": "gpt-4o",
            "metadata": {"project": "mnemo", "nested": {"k": [1, 2]}},
        },
        format="json",
    )
    assert created.status_code == 201
    conversation = Conversation.objects.get(pk=created.json()["id"])
    base = f"/api/v1/conversations/{conversation.id}"

    def post(path: str, data: Any = None, *, expect: int = 201, **headers: str) -> dict:
        response = owner.client.post(base + path, data, format="json", **headers)
        assert response.status_code == expect, response.content
        return response.json()

    return conversation, post


def tool_turn(post: Callable[..., dict]) -> dict:
    """A turn with every part type: text and an image, a tool call (keyed by header), its result, and an
    error result with metadata. Returns the turn."""
    turn = post("/turns")
    post(
        "/messages",
        {
            "role": "user",
            "content": "What is in this screenshot? 日本語",
            "parts": [
                {"type": "text", "text": "What is in this screenshot? 日本語"},
                {"type": "image", "image_id": "img_abc123", "detail": "high"},
            ],
            "idempotency_key": "u-1",
        },
    )
    call = {"type": "tool_call", "id": "call_1", "name": "read_file", "arguments": {"path": "/etc/hosts"}}
    post("/messages", {"role": "assistant", "parts": [call]}, HTTP_IDEMPOTENCY_KEY="a-1")
    result = {
        "type": "tool_result",
        "tool_call_id": "call_1",
        "name": "read_file",
        "content": "127.0.0.1 localhost",
    }
    post("/messages", {"role": "tool", "parts": [result]})
    post("/messages", error_result())
    return turn


def error_result() -> dict[str, Any]:
    return {
        "role": "tool",
        "content": "permission denied",
        "is_error": True,
        "parts": [
            {
                "type": "tool_result",
                "tool_call_id": "call_2",
                "content": [{"type": "text", "text": "permission denied"}],
                "is_error": True,
            }
        ],
        "metadata": {"exit_code": 1},
    }


def compaction_records(conversation: Conversation) -> None:
    """A compaction boundary and its summary, as compaction writes them."""
    orm_append(
        conversation,
        role=Message.Role.SYSTEM,
        kind=Message.Kind.COMPACT_BOUNDARY,
        content="Conversation compacted",
        metadata={"trigger": "auto", "preTokens": 155727},
    )
    orm_append(
        conversation,
        role=Message.Role.USER,
        kind=Message.Kind.COMPACT_SUMMARY,
        content="Summary: the user asked about a screenshot; /etc/hosts was read.",
        metadata={"segment": 1, "coversSeq": [1, 5]},
    )


def later_turns(post: Callable[..., dict], *, first_message_id: str) -> None:
    """An ended turn with an explicit parent and an incomplete reply, then an active turn."""
    turn = post("/turns")
    post("/messages", {"role": "user", "content": "Back to the start.", "parent_id": first_message_id})
    post("/messages", {"role": "assistant", "content": "Partial repl", "completed": False})
    post(f"/turns/{turn['id']}/end", expect=200)
    post("/turns")
    post("/messages", {"role": "user", "content": "Still here", "metadata": {"client": "cli"}})


def rich_build(owner) -> Conversation:
    """A conversation built through the API with everything a transcript carries: a message before any
    turn, turns ended, compacted and active, every part type, an error, an incomplete reply, idempotency
    keys (body and header), metadata, an explicit parent, a compaction boundary and summary, archived."""
    conversation, post = rich_conversation(owner)
    first = post("/messages", {"role": "system", "content": "You are terse."})
    turn1 = tool_turn(post)
    post(f"/turns/{turn1['id']}/end", expect=200)
    compaction_records(conversation)
    later_turns(post, first_message_id=first["id"])
    Turn.objects.filter(pk=turn1["id"]).update(status=Turn.Status.COMPACTED)
    response = owner.client.patch(
        f"/api/v1/conversations/{conversation.id}", {"archived": True}, format="json"
    )
    assert response.status_code == 200
    conversation.refresh_from_db()
    return conversation


def snapshot(conversation: Conversation) -> dict[str, Any]:
    """Everything an import must reproduce, with ids replaced by what they point at."""
    messages = list(conversation.messages.select_related("turn").order_by("seq"))
    seq_of = {m.id: m.seq for m in messages}
    return {
        "conversation": (
            conversation.title,
            conversation.model,
            conversation.metadata,
            conversation.end_user.external_id if conversation.end_user else None,
            conversation.created_at,
            conversation.archived_at,
            conversation.last_seq,
            conversation.last_turn_index,
        ),
        "turns": [
            (t.index, t.status, t.started_at, t.ended_at) for t in conversation.turns.order_by("index")
        ],
        "messages": [
            (
                m.seq,
                m.turn.index if m.turn else None,
                seq_of.get(m.parent_id),
                m.role,
                m.kind,
                m.content,
                m.parts,
                m.token_count,
                m.completed,
                m.is_error,
                m.idempotency_key,
                m.metadata,
                m.created_at,
            )
            for m in messages
        ],
    }


# --- lines of a file to import -----------------------------------------------------------------------

HEADER = {
    "type": "conversation",
    "version": 1,
    "title": "t",
    "model": "gpt-4o",
    "turns": [{"index": 1, "status": "ended"}],
}


def entry(uuid: str, parent: str | None, seq: int, **fields: Any) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "parentUuid": parent,
        "type": "user",
        "role": "user",
        "content": f"m{seq}",
        "seq": seq,
    } | fields


def without(mapping: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k != key}


def jsonl(*lines: Any) -> bytes:
    return b"\n".join(
        line if isinstance(line, bytes) else (line if isinstance(line, str) else json.dumps(line)).encode()
        for line in lines
    )


A = entry("a", None, 1)


def first_line(**fields: Any) -> bytes:
    """A header and one message line (line 2) with these fields changed."""
    return jsonl(HEADER, A | fields)


def header_turns(*turns: Any) -> bytes:
    return jsonl(HEADER | {"turns": list(turns)}, A)
