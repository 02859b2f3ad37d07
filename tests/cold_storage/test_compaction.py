"""Visual compaction when a turn ends, the cold tier, expanding a placeholder back to its bytes, and how the
context pipeline renders kept images, placeholders and duplicates for each provider."""

import hashlib
import threading

import pytest
from django.db import connection, connections
from rest_framework.test import APIClient

from cold_storage.models import ArchivedImage
from conversations.models import Message, Turn
from providers.tokens import count_message, count_text
from tests.cold_storage.conftest import blob_files
from tests.cold_storage.helpers import b64, frame, image_part

pytestmark = pytest.mark.django_db


def base(conversation):
    return f"/api/v1/conversations/{conversation.id}"


def append(actor, conversation, payload):
    response = actor.client.post(f"{base(conversation)}/messages", payload, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def start_turn(actor, conversation, capture):
    with capture(execute=True):
        response = actor.client.post(f"{base(conversation)}/turns")
    assert response.status_code == 201
    return response.json()


def end_turn(actor, conversation, turn, capture):
    with capture(execute=True):
        response = actor.client.post(f"{base(conversation)}/turns/{turn['id']}/end")
    assert response.status_code == 200
    return response.json()


def computer_use_turn(actor, conversation, seeds, *, error_at=None):
    """A user request, then one tool message with a screenshot per step. Returns the image ids."""
    append(actor, conversation, {"role": "user", "content": "Open the settings and enable dark mode."})
    ids = []
    for step, seed in enumerate(seeds):
        body = {"role": "tool", "parts": [image_part(frame(seed))], "is_error": step == error_at}
        ids.append(append(actor, conversation, body)["parts"][0]["image_id"])
    append(actor, conversation, {"role": "assistant", "content": "Done."})
    return ids


def part_of(image_id):
    message = Message.objects.get(pk=ArchivedImage.objects.get(pk=image_id).message_id)
    return message, next(p for p in message.parts if p.get("image_id") == image_id)


def test_ending_a_turn_keeps_anchor_result_and_errors_and_compacts_the_rest(
    owner, conversation, django_capture_on_commit_callbacks
):
    turn = start_turn(owner, conversation, django_capture_on_commit_callbacks)
    ids = computer_use_turn(owner, conversation, [10, 11, 12, 13, 14, 15], error_at=3)
    before = {i: part_of(i)[0].token_count for i in ids}
    ended = end_turn(owner, conversation, turn, django_capture_on_commit_callbacks)
    assert ended["status"] == "compacted"

    rows = {row.id: row for row in ArchivedImage.objects.all()}
    assert [rows[i].role for i in ids] == ["anchor", "process", "process", "error", "process", "result"]
    kept, compacted = [ids[0], ids[3], ids[5]], [ids[1], ids[2], ids[4]]
    for image_id in kept:
        message, part = part_of(image_id)
        assert "compacted" not in part and rows[image_id].tier == "hot"
        # Kept frames of an ended turn go to low detail: 85 tokens instead of the full tiles.
        assert part["detail"] == "low"
        assert message.token_count == count_message(role="tool", content="", model="gpt-4o") + 85
        assert message.token_count < before[image_id]
    for image_id in compacted:
        message, part = part_of(image_id)
        assert part["compacted"] is True
        assert rows[image_id].tier == "cold" and rows[image_id].compacted_at is not None
        # The placeholder costs a line of text now, not the image.
        line = f"[Visual_Placeholder: {image_id}]"
        assert (
            message.token_count
            == count_message(role="tool", content="", model="gpt-4o") + count_text(line, model="gpt-4o") + 1
        )
    hot = [name for name in blob_files() if name.startswith("hot/")]
    cold = [name for name in blob_files() if name.startswith("cold/")]
    assert (len(hot), len(cold)) == (3, 3)

    # Ending it again changes nothing.
    again = end_turn(owner, conversation, turn, django_capture_on_commit_callbacks)
    assert again["ended_at"] == ended["ended_at"] and again["status"] == "compacted"


def test_a_tenant_can_keep_the_detail_of_kept_frames(owner, conversation, django_capture_on_commit_callbacks):
    owner.tenant.settings = {"history_image_detail": "keep"}
    owner.tenant.save()
    turn = start_turn(owner, conversation, django_capture_on_commit_callbacks)
    ids = computer_use_turn(owner, conversation, [30, 31, 32])
    before = {i: part_of(i)[0].token_count for i in ids}
    end_turn(owner, conversation, turn, django_capture_on_commit_callbacks)
    for image_id in (ids[0], ids[2]):
        message, part = part_of(image_id)
        assert part.get("detail", "auto") != "low"
        assert message.token_count == before[image_id]


def test_a_compacted_placeholder_expands_back_to_the_exact_bytes(
    owner, conversation, django_capture_on_commit_callbacks
):
    turn = start_turn(owner, conversation, django_capture_on_commit_callbacks)
    ids = computer_use_turn(owner, conversation, [20, 21, 22])
    end_turn(owner, conversation, turn, django_capture_on_commit_callbacks)
    middle = ids[1]
    assert ArchivedImage.objects.get(pk=middle).tier == "cold"
    response = owner.client.get(f"/api/v1/images/{middle}")
    assert response.status_code == 200
    assert response.content == frame(21)
    assert response["Content-Type"] == "image/png"
    assert response["X-Image-Tier"] == "cold"
    assert response["X-Image-Sha256"] == hashlib.sha256(frame(21)).hexdigest()


def test_starting_the_next_turn_compacts_the_previous_and_the_current_keeps_everything(
    owner, conversation, django_capture_on_commit_callbacks
):
    first = start_turn(owner, conversation, django_capture_on_commit_callbacks)
    old = computer_use_turn(owner, conversation, [30, 31, 32])
    second = start_turn(owner, conversation, django_capture_on_commit_callbacks)
    current = computer_use_turn(owner, conversation, [40, 41, 42, 43])
    assert Turn.objects.get(pk=first["id"]).status == "compacted"
    assert Turn.objects.get(pk=second["id"]).status == "active"
    assert part_of(old[1])[1].get("compacted") is True
    assert not any(part_of(i)[1].get("compacted") for i in current)
    assert all(ArchivedImage.objects.get(pk=i).tier == "hot" for i in current)


def test_a_turn_without_images_just_ends(owner, conversation, django_capture_on_commit_callbacks):
    turn = start_turn(owner, conversation, django_capture_on_commit_callbacks)
    append(owner, conversation, {"role": "user", "content": "hi"})
    assert end_turn(owner, conversation, turn, django_capture_on_commit_callbacks)["status"] == "ended"


def test_a_kept_duplicate_keeps_the_pixels_of_its_original(
    owner, conversation, django_capture_on_commit_callbacks
):
    turn = start_turn(owner, conversation, django_capture_on_commit_callbacks)
    ids = computer_use_turn(owner, conversation, [50, 52, 51, 51])  # the result repeats step 3
    assert part_of(ids[3])[1]["duplicate_of"] == ids[2]
    end_turn(owner, conversation, turn, django_capture_on_commit_callbacks)
    # ids[2] is a middle frame, but the result says "screen unchanged since" it: its pixels stay.
    assert "compacted" not in part_of(ids[2])[1]
    assert ArchivedImage.objects.get(pk=ids[2]).tier == "hot"
    assert part_of(ids[1])[1]["compacted"] is True


def test_compaction_sends_a_turn_compacted_event(owner, conversation, django_capture_on_commit_callbacks):
    from unittest import mock

    turn = start_turn(owner, conversation, django_capture_on_commit_callbacks)
    ids = computer_use_turn(owner, conversation, [60, 61, 62])
    with mock.patch("conversations.services.turns.event_publish") as publish:
        end_turn(owner, conversation, turn, django_capture_on_commit_callbacks)
    events = {c.kwargs["event"]: c.kwargs["data"] for c in publish.call_args_list}
    assert set(events) == {"turn.ended", "turn.compacted"}
    assert events["turn.compacted"]["compacted"] == [ids[1]]
    assert events["turn.compacted"]["kept"] == [ids[0], ids[2]]
    assert events["turn.compacted"]["tokens_after"] < events["turn.compacted"]["tokens_before"]


# --- rendering through the context pipeline ---------------------------------------------------------------


def context(actor, conversation, fmt):
    response = actor.client.post(
        f"{base(conversation)}/context", {"user_message": "next step?", "format": fmt}, format="json"
    )
    assert response.status_code == 200, response.json()
    return response.json()


def test_openai_rendering(owner, conversation, django_capture_on_commit_callbacks):
    turn = start_turn(owner, conversation, django_capture_on_commit_callbacks)
    ids = computer_use_turn(owner, conversation, [70, 71, 71, 72])  # step 3 repeats step 2
    end_turn(owner, conversation, turn, django_capture_on_commit_callbacks)
    body = context(owner, conversation, "openai")
    messages = body["messages"]
    text = str(messages)
    assert f"[Visual_Placeholder: {ids[1]}]" in text
    assert f"screen unchanged since {ids[1]}" in text
    images = [
        block["image_url"]
        for m in messages
        if isinstance(m["content"], list)
        for block in m["content"]
        if block["type"] == "image_url"
    ]
    assert [i["url"] for i in images] == [
        "data:image/png;base64," + b64(frame(70)),
        "data:image/png;base64," + b64(frame(72)),
    ]
    assert all(i["detail"] == "low" for i in images)  # kept frames of an ended turn
    assert body["degradations"] == []
    # History tokens are the stored counts, images included.
    assert body["tokens"]["history"] == sum(
        m.token_count for m in Message.objects.filter(conversation=conversation)
    )


def test_anthropic_and_gemini_rendering(owner, conversation, django_capture_on_commit_callbacks):
    start_turn(owner, conversation, django_capture_on_commit_callbacks)
    ids = computer_use_turn(owner, conversation, [80, 81])
    anthropic = context(owner, conversation, "anthropic")["messages"]
    blocks = [b for m in anthropic for b in m["content"] if b.get("type") == "image"]
    assert [b["source"] for b in blocks] == [
        {"type": "base64", "media_type": "image/png", "data": b64(frame(s))} for s in (80, 81)
    ]
    gemini = context(owner, conversation, "gemini")["messages"]
    inline = [p["inlineData"] for m in gemini for p in m["parts"] if "inlineData" in p]
    assert inline == [{"mimeType": "image/png", "data": b64(frame(s))} for s in (80, 81)]
    assert len(ids) == 2


def test_ended_turns_render_the_same_bytes_every_call(
    owner, conversation, django_capture_on_commit_callbacks
):
    start_turn(owner, conversation, django_capture_on_commit_callbacks)
    computer_use_turn(owner, conversation, [90, 91, 92])
    start_turn(owner, conversation, django_capture_on_commit_callbacks)  # compacts turn 1
    computer_use_turn(owner, conversation, [93])
    first = context(owner, conversation, "anthropic")
    again = context(owner, conversation, "anthropic")
    assert first["blocks"]["B6"]["sha256"] == again["blocks"]["B6"]["sha256"]
    assert first["prefix"]["hashes"] == again["prefix"]["hashes"]
    # A later step of the current turn leaves everything before it byte-identical.
    computer_use_turn(owner, conversation, [94])
    later = context(owner, conversation, "anthropic")
    n = len(first["messages"]) - 1  # without the current user message

    def strip(ms):
        return [
            {**m, "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]}
            for m in ms
        ]

    assert strip(later["messages"][:n])[: n - 1] == strip(first["messages"][:n])[: n - 1]


def test_a_missing_image_is_a_degradation_not_a_500(owner, conversation, django_capture_on_commit_callbacks):
    start_turn(owner, conversation, django_capture_on_commit_callbacks)
    ids = computer_use_turn(owner, conversation, [95])
    from cold_storage.storage import HOT, tier_storage

    tier_storage(HOT).delete(ArchivedImage.objects.get(pk=ids[0]).storage_key)
    body = context(owner, conversation, "openai")
    assert f"[Image unavailable: {ids[0]}]" in str(body["messages"])
    assert [d["code"] for d in body["degradations"]] == ["image_unavailable"]


@pytest.mark.django_db(transaction=True)
def test_two_requests_ending_the_same_turn_compact_it_once(owner, conversation):
    if connection.vendor != "postgresql":
        pytest.skip("row-lock concurrency is tested on PostgreSQL (set DATABASE_URL)")
    from unittest import mock

    turn = owner.client.post(f"{base(conversation)}/turns").json()
    ids = computer_use_turn(owner, conversation, [100, 101, 102, 103, 104])
    threads_n = 6
    start = threading.Barrier(threads_n)
    statuses: list[int] = []
    compactions: list[str] = []
    from conversations import visual

    real = visual.turn_compact

    def counting(**kwargs):
        result = real(**kwargs)
        if result is not None:
            compactions.append(str(kwargs["turn"].pk))
        return result

    def worker():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {owner.raw_key}")
        try:
            start.wait()
            statuses.append(client.post(f"{base(conversation)}/turns/{turn['id']}/end").status_code)
        finally:
            connections.close_all()

    with mock.patch.object(visual, "turn_compact", counting):
        threads = [threading.Thread(target=worker) for _ in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert statuses == [200] * threads_n
    assert compactions == [turn["id"]]
    parts = [part_of(i)[1] for i in ids]
    assert [p.get("compacted", False) for p in parts] == [False, True, True, True, False]
    assert ArchivedImage.objects.filter(tier="cold").count() == 3
    assert len([n for n in blob_files() if n.startswith("cold/")]) == 3
    assert len([n for n in blob_files() if n.startswith("hot/")]) == 2


def test_a_placeholder_costs_few_tokens_and_ids_stay_unique():
    """Ids are 80 random bits written as 24 digits, which tiktoken reads three at a time."""
    from cold_storage.models import new_image_id
    from conversations.parts import IMAGE_ID_RE, PLACEHOLDER

    ids = {new_image_id() for _ in range(2000)}
    assert len(ids) == 2000 and all(IMAGE_ID_RE.match(i) and len(i) == 28 for i in ids)
    for model in ("gpt-4o", "gpt-4"):
        costs = {count_text(PLACEHOLDER.format(image_id=i), model=model) for i in list(ids)[:200]}
        assert max(costs) <= 17, (model, costs)
