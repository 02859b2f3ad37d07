"""POST /conversations/import: the seed's own file shape, refusals that store nothing, and what an import
queues."""

import json
from datetime import UTC, datetime

import pytest
from django.test import override_settings

from conversations.models import Conversation, Message, Turn
from conversations.tokens import message_token_count
from tenants.models import EndUser
from tests.conversations.transcripts import (
    HEADER,
    A,
    entry,
    export,
    first_line,
    header_turns,
    import_transcript,
    jsonl,
    without,
)

pytestmark = pytest.mark.django_db


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
