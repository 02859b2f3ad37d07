"""GET …/transcript.jsonl and POST /conversations/import: the export's shape, byte-exact round trips, the
seed's own file shape, and refusals that store nothing."""

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import override_settings

from conversations.models import Conversation, Message, Turn
from conversations.services import message_token_count
from conversations.transcript import EXPORT_PAGE
from tenants.models import EndUser
from tests.factories import ArchivedImageFactory

pytestmark = pytest.mark.django_db

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


@pytest.fixture
def rich(owner) -> Conversation:
    """A conversation built through the API with everything a transcript carries: a message before any
    turn, turns ended, compacted and active, every part type, an error, an incomplete reply, idempotency
    keys (body and header), metadata, an explicit parent, a compaction boundary and summary, archived."""
    client = owner.client
    ArchivedImageFactory(tenant=owner.tenant, id="img_abc123")
    created = client.post(
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
        response = client.post(base + path, data, format="json", **headers)
        assert response.status_code == expect, response.content
        return response.json()

    first = post("/messages", {"role": "system", "content": "You are terse."})
    turn1 = post("/turns")
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
    post(
        "/messages",
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "call_1",
                    "name": "read_file",
                    "arguments": {"path": "/etc/hosts"},
                }
            ],
        },
        HTTP_IDEMPOTENCY_KEY="a-1",
    )
    post(
        "/messages",
        {
            "role": "tool",
            "parts": [
                {
                    "type": "tool_result",
                    "tool_call_id": "call_1",
                    "name": "read_file",
                    "content": "127.0.0.1 localhost",
                }
            ],
        },
    )
    post(
        "/messages",
        {
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
        },
    )
    post(f"/turns/{turn1['id']}/end", expect=200)
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
    turn2 = post("/turns")
    post("/messages", {"role": "user", "content": "Back to the start.", "parent_id": first["id"]})
    post("/messages", {"role": "assistant", "content": "Partial repl", "completed": False})
    post(f"/turns/{turn2['id']}/end", expect=200)
    post("/turns")
    post("/messages", {"role": "user", "content": "Still here", "metadata": {"client": "cli"}})
    Turn.objects.filter(pk=turn1["id"]).update(status=Turn.Status.COMPACTED)
    assert client.patch(base, {"archived": True}, format="json").status_code == 200
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


# --- export ------------------------------------------------------------------------------------------------


def test_export_has_a_header_then_one_line_per_message_in_seq_order(owner, rich):
    body = export(owner.client, rich.id)
    header, *entries = lines_of(body)

    assert header == {
        "type": "conversation",
        "version": 1,
        "id": str(rich.id),
        "title": "Round trip ✓",
        "model": "gpt-4o",
        "endUser": "alice",
        "metadata": {"project": "mnemo", "nested": {"k": [1, 2]}},
        "createdAt": iso(rich.created_at),
        "archivedAt": iso(rich.archived_at),
        "turns": [
            {"index": t.index, "status": t.status, "startedAt": iso(t.started_at), "endedAt": iso(t.ended_at)}
            for t in rich.turns.order_by("index")
        ],
    }
    assert [t["status"] for t in header["turns"]] == ["compacted", "ended", "active"]

    messages = list(rich.messages.order_by("seq"))
    assert [e["uuid"] for e in entries] == [str(m.id) for m in messages]
    assert [e["seq"] for e in entries] == list(range(1, 11))
    assert [e["parentUuid"] for e in entries][:6] == [None, *[str(m.id) for m in messages[:5]]]

    boundary, summary = entries[5], entries[6]
    assert b'"subtype":"compact_boundary"' in body
    assert b'"isCompactSummary":true' in body
    assert {k: boundary[k] for k in ("type", "subtype", "role", "content", "compactMetadata")} == {
        "type": "system",
        "subtype": "compact_boundary",
        "role": "system",
        "content": "Conversation compacted",
        "compactMetadata": {"trigger": "auto", "preTokens": 155727},
    }
    assert "metadata" not in boundary and "isCompactSummary" not in boundary
    assert (summary["type"], summary["isCompactSummary"], summary["metadata"]["segment"]) == ("user", True, 1)
    assert sum(b'"isCompactSummary"' in line for line in body.splitlines()) == 1

    image_message = entries[1]
    # Turn 1 has ended: its only frame (anchor and result) was kept, at low detail.
    assert image_message["parts"][1] == {"type": "image", "image_id": "img_abc123", "detail": "low"}
    assert (image_message["turnIndex"], image_message["idempotencyKey"]) == (1, "u-1")
    assert entries[2]["idempotencyKey"] == "a-1"
    assert "turnIndex" not in entries[0] and "idempotencyKey" not in entries[0]
    assert (entries[4]["isError"], entries[4]["metadata"]) == (True, {"exit_code": 1})
    assert entries[8]["completed"] is False
    assert [e["turnIndex"] for e in entries[7:]] == [2, 2, 3]
    assert [e["tokenCount"] for e in entries] == [m.token_count for m in messages]
    assert all(m.token_count > 0 for m in messages)


def test_export_names_an_explicit_parent_instead_of_the_previous_line(owner, rich):
    entries = lines_of(export(owner.client, rich.id))[1:]
    back = next(e for e in entries if e["content"] == "Back to the start.")
    assert back["parentUuid"] == entries[0]["uuid"]
    assert back["parentUuid"] != entries[entries.index(back) - 1]["uuid"]


def test_export_of_more_than_one_page_is_complete_and_in_order(owner, conversation):
    count = EXPORT_PAGE * 2 + 37
    Message.objects.bulk_create(
        Message(conversation=conversation, seq=seq, role="user", content=f"message {seq}")
        for seq in range(1, count + 1)
    )
    Conversation.objects.filter(pk=conversation.pk).update(last_seq=count)

    response = owner.client.get(export_url(conversation.id))
    header, *entries = lines_of(read_stream(response))

    assert header["type"] == "conversation"
    ids = list(conversation.messages.order_by("seq").values_list("id", flat=True))
    assert [e["uuid"] for e in entries] == [str(i) for i in ids]
    assert [e["seq"] for e in entries] == list(range(1, count + 1))
    assert [e["content"] for e in entries] == [f"message {seq}" for seq in range(1, count + 1)]
    # The chain of parents runs unbroken across page boundaries.
    assert [e["parentUuid"] for e in entries] == [None, *[str(i) for i in ids[:-1]]]


def test_outsider_gets_404_on_export(outsider, conversation):
    response = outsider.client.get(export_url(conversation.id))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_anonymous_gets_401_on_export_and_import(anonymous, conversation):
    before = Conversation.objects.count()
    response = anonymous.get(export_url(conversation.id))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    response = anonymous.post(
        IMPORT_URL, data=b'{"uuid":"a","role":"user","content":"x"}', content_type=NDJSON
    )
    assert response.status_code == 401
    assert Conversation.objects.count() == before


# --- round trip --------------------------------------------------------------------------------------------


def test_export_import_export_is_byte_identical_but_for_the_new_ids(owner, rich):
    original = export(owner.client, rich.id)

    response = import_transcript(owner.client, original)
    assert response.status_code == 201, response.content
    imported = Conversation.objects.get(pk=response.json()["id"])
    again = export(owner.client, imported.id)

    old_ids = [lines_of(original)[0]["id"], *(e["uuid"] for e in lines_of(original)[1:])]
    new_ids = [
        str(imported.id),
        *(str(i) for i in imported.messages.order_by("seq").values_list("id", flat=True)),
    ]
    assert len(old_ids) == len(new_ids) == 11
    assert not set(old_ids) & set(new_ids), "the import must assign fresh ids"
    expected = original
    for old, new in zip(old_ids, new_ids, strict=True):
        assert original.count(old.encode()) >= 1
        expected = expected.replace(old.encode(), new.encode())
    assert again == expected


def test_import_reproduces_the_conversation_with_fresh_ids(owner, rich):
    response = import_transcript(owner.client, export(owner.client, rich.id))
    assert response.status_code == 201
    body = response.json()
    imported = Conversation.objects.get(pk=body["id"])

    assert snapshot(imported) == snapshot(rich)
    assert imported.tenant_id == owner.tenant.id
    assert imported.end_user_id == rich.end_user_id
    assert (body["message_count"], body["archived"], body["title"]) == (10, True, "Round trip ✓")
    assert not set(imported.turns.values_list("id", flat=True)) & set(rich.turns.values_list("id", flat=True))
    assert not set(imported.messages.values_list("id", flat=True)) & set(
        rich.messages.values_list("id", flat=True)
    )
    # The explicit parent points into the new conversation, at the copy of the original parent.
    back = imported.messages.get(content="Back to the start.")
    assert back.parent == imported.messages.get(seq=1)
    # Lines whose parent is simply the previous line store no explicit parent.
    assert imported.messages.filter(parent__isnull=False).count() == 1


def test_import_recomputes_token_counts_instead_of_trusting_the_file(owner, rich):
    header, *entries = lines_of(export(owner.client, rich.id))
    for entry in entries:
        entry["tokenCount"] = 999_999
    body = b"".join(json.dumps(line).encode() + b"\n" for line in [header, *entries])

    response = import_transcript(owner.client, body)
    assert response.status_code == 201
    imported = Conversation.objects.get(pk=response.json()["id"])
    counts = list(imported.messages.order_by("seq").values_list("token_count", flat=True))
    assert counts == list(rich.messages.order_by("seq").values_list("token_count", flat=True))
    assert 999_999 not in counts


def test_imported_conversation_continues_after_the_last_seq_and_turn(owner, rich):
    imported_id = import_transcript(owner.client, export(owner.client, rich.id)).json()["id"]
    base = f"/api/v1/conversations/{imported_id}"

    turn = owner.client.post(f"{base}/turns")
    assert (turn.status_code, turn.json()["index"]) == (201, 4)
    message = owner.client.post(f"{base}/messages", {"role": "user", "content": "next"}, format="json")
    assert (message.status_code, message.json()["seq"]) == (201, 11)
    # Idempotency keys came along: a retry of an imported message returns it instead of adding one.
    original = rich.messages.get(idempotency_key="u-1")
    retry = {"role": "user", "content": original.content, "parts": original.parts, "idempotency_key": "u-1"}
    replay = owner.client.post(f"{base}/messages", retry, format="json")
    assert replay.status_code == 200, replay.content
    assert replay.json()["id"] == str(
        Message.objects.get(conversation_id=imported_id, idempotency_key="u-1").id
    )
    assert Message.objects.filter(conversation_id=imported_id).count() == 11


def test_empty_conversation_round_trips(owner, conversation):
    original = export(owner.client, conversation.id)
    assert len(original.splitlines()) == 1

    response = import_transcript(owner.client, original)
    assert response.status_code == 201
    imported = Conversation.objects.get(pk=response.json()["id"])
    assert not imported.messages.exists()
    assert export(owner.client, imported.id) == original.replace(
        str(conversation.id).encode(), str(imported.id).encode()
    )


def test_round_trip_keeps_line_separators_inside_content(owner, conversation):
    # JSON leaves U+2028, U+2029 and U+0085 unescaped; they must not split a line on import.
    content = "one\u2028two\u2029three\x85four\r\nfive"
    url = f"/api/v1/conversations/{conversation.id}/messages"
    assert owner.client.post(url, {"role": "user", "content": content}, format="json").status_code == 201
    original = export(owner.client, conversation.id)
    assert "\u2028".encode() in original
    assert len(original.split(b"\n")) == 3  # header, message, final newline

    response = import_transcript(owner.client, original)
    assert response.status_code == 201, response.content
    assert Message.objects.get(conversation_id=response.json()["id"]).content == content


def test_import_accepts_crlf_line_endings(owner):
    body = jsonl(HEADER, entry("a", None, 1), entry("b", "a", 2)).replace(b"\n", b"\r\n") + b"\r\n"
    response = import_transcript(owner.client, body)
    assert response.status_code == 201, response.content
    imported = Message.objects.filter(conversation_id=response.json()["id"]).order_by("seq")
    assert list(imported.values_list("content", flat=True)) == ["m1", "m2"]


def without_images(body: bytes) -> bytes:
    """The transcript with its image parts left out (they name images of the exporting tenant)."""
    lines = lines_of(body)
    for line in lines[1:]:
        if "parts" in line:
            line["parts"] = [p for p in line["parts"] if p["type"] != "image"]
    return jsonl(*lines)


def test_import_always_lands_in_the_callers_tenant(owner, outsider, rich):
    response = import_transcript(outsider.client, without_images(export(owner.client, rich.id)))
    assert response.status_code == 201, response.content
    imported = Conversation.objects.get(pk=response.json()["id"])
    assert imported.tenant_id == outsider.tenant.id
    assert imported.end_user.tenant_id == outsider.tenant.id
    assert owner.client.get(f"/api/v1/conversations/{imported.id}").status_code == 404


def test_import_refuses_another_tenants_image_alike_a_random_id(owner, outsider):
    """A part naming another tenant's image is refused with the part's index, exactly as an id no tenant
    has: the token count of the stored message would otherwise tell the image exists, and its size."""
    real = ArchivedImageFactory(tenant=owner.tenant, width=64, height=48).id
    answers = []
    for image_id in (real, "img_0123456789abcdef"):
        parts = [{"type": "text", "text": "look"}, {"type": "image", "image_id": image_id, "detail": "high"}]
        response = import_transcript(outsider.client, first_line(parts=parts))
        assert response.status_code == 400, response.content
        body = response.json()
        body["error"].pop("request_id")  # each request's own id
        answers.append(json.dumps(body).replace(image_id, "<image>"))
    assert answers[0] == answers[1]
    error = json.loads(answers[0])["error"]
    assert (error["code"], error["extra"]["line"], error["extra"]["index"]) == ("invalid_image", 2, 1)
    assert not Conversation.objects.filter(tenant=outsider.tenant).exists()


def test_import_counts_the_tenants_own_images(owner):
    ArchivedImageFactory(tenant=owner.tenant, id="img_own0001", width=64, height=48)
    nested = {
        "type": "tool_result",
        "tool_call_id": "c1",
        "content": [{"type": "image", "image_id": "img_own0001"}],
    }
    parts = [{"type": "image", "image_id": "img_own0001", "detail": "high"}, nested]
    response = import_transcript(owner.client, first_line(parts=parts))
    assert response.status_code == 201, response.content
    message = Message.objects.get(conversation_id=response.json()["id"])
    assert message.token_count > 2 * 85  # both images at their provider's price, not as missing


def test_image_tokens_are_looked_up_inside_the_tenant(owner, outsider):
    """Another tenant's image costs what an unknown id does (its one line of text), never its size."""
    from conversations.parts import UNAVAILABLE
    from conversations.visual import parts_image_tokens
    from providers.tokens import count_text

    real = ArchivedImageFactory(tenant=owner.tenant, width=1920, height=1080).id
    parts = [{"type": "image", "image_id": real, "detail": "high"}]
    unavailable = count_text(UNAVAILABLE.format(image_id=real), model="gpt-4o") + 1
    assert parts_image_tokens(parts, tenant_id=outsider.tenant.pk, model="gpt-4o") == unavailable
    assert parts_image_tokens(parts, tenant_id=owner.tenant.pk, model="gpt-4o") > 1000


# --- the seed's shape --------------------------------------------------------------------------------------


def test_seed_style_file_without_header_and_with_epoch_milliseconds_imports(owner):
    seed = [
        {
            "uuid": "u-1",
            "parentUuid": None,
            "type": "user",
            "role": "user",
            "content": "Hi",
            "timestamp": 1700000000000,
        },
        {
            "uuid": "a-1",
            "parentUuid": "u-1",
            "role": "assistant",
            "content": "Hello!",
            "timestamp": 1700000001500,
        },
        {
            "uuid": "abc-123",
            "parentUuid": "a-1",
            "type": "system",
            "subtype": "compact_boundary",
            "role": "system",
            "content": "Conversation compacted",
            "compactMetadata": {"trigger": "auto", "preTokens": 155727},
        },
        {
            "uuid": "def-456",
            "parentUuid": "abc-123",
            "role": "user",
            "content": "A detailed technical summary...",
            "isCompactSummary": True,
            "timestamp": 1234567890,
        },
    ]
    body = "\n".join(json.dumps(line, ensure_ascii=False) for line in seed).encode()

    response = import_transcript(owner.client, body)
    assert response.status_code == 201, response.content
    imported = Conversation.objects.get(pk=response.json()["id"])
    assert (imported.model, imported.title, imported.end_user, imported.last_seq) == ("gpt-4o", "", None, 4)
    messages = list(imported.messages.order_by("seq"))
    assert [(m.seq, m.role, m.kind) for m in messages] == [
        (1, "user", "message"),
        (2, "assistant", "message"),
        (3, "system", "compact_boundary"),
        (4, "user", "compact_summary"),
    ]
    assert messages[0].created_at == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert messages[1].created_at == datetime(2023, 11, 14, 22, 13, 21, 500000, tzinfo=UTC)
    assert messages[3].created_at == datetime.fromtimestamp(1234567.890, tz=UTC)
    assert messages[2].metadata == {"trigger": "auto", "preTokens": 155727}
    assert all(m.parent_id is None and m.turn_id is None and m.completed for m in messages)
    assert [m.token_count for m in messages] == [
        message_token_count(
            role=m.role, content=m.content, parts=[], tenant_id=owner.tenant.id, model="gpt-4o"
        )
        for m in messages
    ]


# --- refusals ----------------------------------------------------------------------------------------------

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


BAD_TRANSCRIPTS = [
    # (body, the line the error names)
    pytest.param(jsonl(HEADER, "{not json"), 2, id="not-json"),
    pytest.param(jsonl(HEADER, A, "[1, 2]"), 3, id="array-line"),
    pytest.param(jsonl(HEADER, '"a string"'), 2, id="string-line"),
    pytest.param(jsonl(HEADER, without(A, "uuid")), 2, id="missing-uuid"),
    pytest.param(jsonl(HEADER, entry("", None, 1)), 2, id="empty-uuid"),
    pytest.param(jsonl(HEADER, A, entry("a", "a", 2)), 3, id="duplicate-uuid"),
    pytest.param(first_line(role="robot"), 2, id="bad-role"),
    pytest.param(jsonl(HEADER, without(A, "role")), 2, id="missing-role"),
    pytest.param(first_line(role=["user"]), 2, id="role-not-a-string"),
    pytest.param(jsonl(HEADER, entry("a", None, 2), entry("b", "a", 2)), 3, id="seq-repeated"),
    pytest.param(jsonl(HEADER, entry("a", None, 5), entry("b", "a", 3)), 3, id="seq-decreasing"),
    pytest.param(first_line(seq="1"), 2, id="seq-not-an-integer"),
    pytest.param(first_line(seq=0), 2, id="seq-zero"),
    pytest.param(first_line(seq=2**63), 2, id="seq-too-large"),
    pytest.param(jsonl(HEADER, A, entry("b", "nobody", 2)), 3, id="parent-unknown"),
    pytest.param(jsonl(HEADER, A, entry("b", "c", 2), entry("c", "b", 3)), 3, id="parent-later-line"),
    pytest.param(first_line(parentUuid="ghost"), 2, id="parent-on-first-line"),
    pytest.param(jsonl(HEADER, A, entry("b", ["a"], 2)), 3, id="parent-not-a-string"),
    pytest.param(first_line(turnIndex=7), 2, id="turn-index-not-in-header"),
    pytest.param(first_line(turnIndex=[1]), 2, id="turn-index-not-an-integer"),
    pytest.param(first_line(parts=[{"type": "image", "image_id": "abc"}]), 2, id="bad-image-id"),
    pytest.param(first_line(parts=[{"type": "video"}]), 2, id="unknown-part-type"),
    pytest.param(first_line(parts=[{"type": "text"}]), 2, id="text-part-without-text"),
    pytest.param(first_line(parts="text"), 2, id="parts-not-a-list"),
    pytest.param(first_line(content=["x"]), 2, id="content-not-a-string"),
    pytest.param(first_line(completed="yes"), 2, id="completed-not-a-boolean"),
    pytest.param(first_line(metadata=[1]), 2, id="metadata-not-an-object"),
    pytest.param(first_line(subtype="microcompact"), 2, id="unknown-subtype"),
    pytest.param(
        jsonl(HEADER, entry("a", None, 1, idempotencyKey="k"), entry("b", "a", 2, idempotencyKey="k")),
        3,
        id="duplicate-idempotency-key",
    ),
    pytest.param(first_line(timestamp="yesterday"), 2, id="timestamp-not-a-time"),
    pytest.param(first_line(timestamp="2024-13-45T00:00:00Z"), 2, id="timestamp-impossible-date"),
    pytest.param(first_line(timestamp=10**20), 2, id="timestamp-out-of-range"),
    pytest.param(jsonl(HEADER | {"version": 2}, A), 1, id="wrong-version"),
    pytest.param(jsonl(without(HEADER, "version"), A), 1, id="missing-version"),
    pytest.param(jsonl(HEADER | {"turns": 5}, A), 1, id="turns-not-a-list"),
    pytest.param(header_turns({"index": -1, "status": "ended"}), 1, id="turn-index-negative"),
    pytest.param(header_turns({"index": 2**31, "status": "ended"}), 1, id="turn-index-too-large"),
    pytest.param(header_turns({"index": 1, "status": "paused"}), 1, id="turn-status-unknown"),
    pytest.param(header_turns({"index": 1, "status": ["ended"]}), 1, id="turn-status-not-a-string"),
    pytest.param(
        header_turns({"index": 1, "status": "active"}, {"index": 2, "status": "active"}),
        1,
        id="two-active-turns",
    ),
    pytest.param(jsonl(HEADER | {"createdAt": "soon"}, A), 1, id="header-time-not-a-time"),
    pytest.param(jsonl(HEADER | {"model": "m" * 101}, A), 1, id="model-too-long"),
    pytest.param(b"", 1, id="empty-body"),
    pytest.param(b"\n  \n", 1, id="blank-lines-only"),
    pytest.param(jsonl(HEADER, A, b'{"uuid":"b","role":"user","content":"caf\xe9"}'), 3, id="not-utf8"),
]


@pytest.mark.parametrize(("body", "line"), BAD_TRANSCRIPTS)
def test_bad_transcript_is_refused_with_its_line_and_stores_nothing(owner, body, line):
    counts = (
        Conversation.objects.count(),
        Message.objects.count(),
        Turn.objects.count(),
        EndUser.objects.count(),
    )

    response = import_transcript(owner.client, body)

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["extra"].get("line")) == ("invalid_transcript", line), error
    assert (
        Conversation.objects.count(),
        Message.objects.count(),
        Turn.objects.count(),
        EndUser.objects.count(),
    ) == (counts)


def test_bad_line_after_many_good_ones_stores_nothing(owner):
    good = [entry(f"m{seq}", f"m{seq - 1}" if seq > 1 else None, seq) for seq in range(1, 201)]
    body = jsonl(HEADER | {"endUser": "bob"}, *good, entry("late", "m200", 201, role="robot"))
    before = (Conversation.objects.count(), Message.objects.count(), EndUser.objects.count())

    response = import_transcript(owner.client, body)

    assert (response.status_code, response.json()["error"]["extra"]["line"]) == (400, 202)
    assert (Conversation.objects.count(), Message.objects.count(), EndUser.objects.count()) == before


def test_oversize_body_gets_413_and_stores_nothing(owner):
    lines = [entry(f"m{seq}", f"m{seq - 1}" if seq > 1 else None, seq) for seq in range(1, 40)]
    body = jsonl(HEADER, *lines)
    assert len(body) > 2048
    small = jsonl(HEADER, *lines[:10])
    assert len(small) < 2048
    before = (Conversation.objects.count(), Message.objects.count())

    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=2048):
        response = import_transcript(owner.client, body)
        assert (Conversation.objects.count(), Message.objects.count()) == before
        # Under the limit the same kind of file is accepted: the refusal was about size alone.
        assert import_transcript(owner.client, small).status_code == 201

    assert response.status_code == 413
    assert response.json()["error"] == {
        "code": "request_too_large",
        "message": "The request body is larger than 2048 bytes.",
        "extra": {"limit_bytes": 2048},
        "request_id": response["X-Request-Id"],
    }


def test_an_imported_history_gets_its_vectors_and_memory_agent_without_a_sweep(
    owner, outsider, rich, settings, local_embeddings, django_capture_on_commit_callbacks
):
    # Before, nothing was queued for an import: a client waiting on retrieval_index (the documented way)
    # waited for the periodic sweep.
    settings.MNEMO_EMBED_ON_APPEND = True
    transcript = export(owner.client, rich.id)
    with django_capture_on_commit_callbacks(execute=True):
        response = import_transcript(owner.client, transcript)
    assert response.status_code == 201
    imported = response.json()["id"]

    index = owner.client.get(f"/api/v1/conversations/{imported}").json()["retrieval_index"]
    assert index["embedded"] == index["messages"] > 0
    agent = owner.client.get(f"/api/v1/conversations/{imported}/memory-agent").json()
    assert agent["pending"] is False
    assert outsider.client.get(f"/api/v1/conversations/{imported}").status_code == 404
