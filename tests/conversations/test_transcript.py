"""GET …/transcript.jsonl and POST /conversations/import: the export's shape and byte-exact round trips."""

import json

import pytest

from conversations.models import Conversation, Message
from conversations.tokens import parts_image_tokens
from conversations.transcript import EXPORT_PAGE
from tests.conversations.transcripts import (
    HEADER,
    IMPORT_URL,
    NDJSON,
    entry,
    export,
    export_url,
    first_line,
    import_transcript,
    iso,
    jsonl,
    lines_of,
    read_stream,
    snapshot,
)
from tests.factories import ArchivedImageFactory

pytestmark = pytest.mark.django_db


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
    for line in entries:
        line["tokenCount"] = 999_999
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
    from providers.tokens import count_text

    real = ArchivedImageFactory(tenant=owner.tenant, width=1920, height=1080).id
    parts = [{"type": "image", "image_id": real, "detail": "high"}]
    unavailable = count_text(UNAVAILABLE.format(image_id=real), model="gpt-4o") + 1
    assert parts_image_tokens(parts, tenant_id=outsider.tenant.pk, model="gpt-4o") == unavailable
    assert parts_image_tokens(parts, tenant_id=owner.tenant.pk, model="gpt-4o") > 1000
