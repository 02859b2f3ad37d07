"""Export and import of a compacted conversation: every boundary and summary record survives, and the
imported conversation's context is the same prompt (the import replays its segments from the summary records;
readiness, the catch-up sweep and a compaction run make them when that replay did not run)."""

import json

import pytest

from conversations.models import Conversation, Message
from summaries.models import SummarySegment
from summaries.selectors import history_start_seq, segments_live
from summaries.services import compaction_catch_up, compaction_run, segment_rebuild, segments_replay
from summaries.services.compaction import replay_pending
from tests.summaries.helpers import budgets, context, history

pytestmark = pytest.mark.django_db


def export(actor, conversation) -> bytes:
    response = actor.client.get(f"/api/v1/conversations/{conversation.id}/transcript.jsonl")
    assert response.status_code == 200

    return b"".join(response.streaming_content)


def import_(actor, data: bytes) -> Conversation:
    response = actor.client.post(
        "/api/v1/conversations/import", data=data, content_type="application/x-ndjson"
    )
    assert response.status_code == 201, response.content
    return Conversation.objects.get(pk=response.json()["id"])


def records(conversation):
    return list(
        Message.objects.filter(conversation=conversation)
        .exclude(kind="message")
        .order_by("seq")
        .values_list("seq", "kind", "role", "content", "metadata")
    )


@pytest.fixture
def compacted(owner, conversation):
    """Three compactions with a roll-up, and a rebuilt segment: every kind of summary record."""
    budgets(owner.tenant, summary=300)
    conversation.refresh_from_db()
    for n in range(3):
        history(conversation, 20, start=n * 20)
        compaction_run(conversation=conversation, trigger="auto")
    segment_rebuild(segment=segments_live(conversation=conversation)[-1])
    history(conversation, 3, start=60)
    return conversation


def test_export_import_keeps_every_boundary_and_summary(owner, compacted):
    data = export(owner, compacted)
    lines = [json.loads(line) for line in data.splitlines()]
    boundary_lines = [line for line in lines if line.get("subtype") == "compact_boundary"]
    assert len(boundary_lines) == 3
    assert all("endSeq" in line["compactMetadata"] for line in boundary_lines)
    assert (
        sum(1 for line in lines if line.get("isCompactSummary"))
        == Message.objects.filter(conversation=compacted, kind="compact_summary").count()
    )

    imported = import_(owner, data)
    assert records(imported) == records(compacted)
    assert history_start_seq(imported) == history_start_seq(compacted)


def shape(segments) -> list[tuple]:
    return [(s.start_seq, s.end_seq, s.level, s.text) for s in segments]


def test_an_import_replays_the_segments_and_the_context_gives_the_same_prompt(
    owner, compacted, django_capture_on_commit_callbacks
):
    original = context(owner, compacted)
    with django_capture_on_commit_callbacks(execute=True):
        imported = import_(owner, export(owner, compacted))

    # The import made the segments from the summary records, superseded ones included: no context call yet.
    assert shape(segments_live(conversation=imported)) == shape(segments_live(conversation=compacted))
    assert (
        SummarySegment.objects.filter(conversation=imported).count()
        == SummarySegment.objects.filter(conversation=compacted).count()
    )
    copy = context(owner, imported)
    assert copy["messages"] == original["messages"]
    assert copy["blocks"]["B4"]["sha256"] == original["blocks"]["B4"]["sha256"]
    # Replaying is done once.
    assert not replay_pending(imported)
    segments_replay(conversation=imported)
    assert context(owner, imported)["messages"] == copy["messages"]
    assert SummarySegment.objects.filter(conversation=imported).count() == len(
        SummarySegment.objects.filter(conversation=compacted)
    )


def test_readiness_waits_for_a_replay_not_yet_made_and_queues_it(owner, compacted):
    imported = import_(owner, export(owner, compacted))  # its on-commit work did not run (a lost task)
    assert replay_pending(imported)

    response = owner.client.get(f"/api/v1/conversations/{imported.id}")
    assert "compaction" in response.json()["readiness"]["waiting_for"]
    # Celery runs eagerly here: the replay the readiness check queued is done by the next look.
    assert shape(segments_live(conversation=imported)) == shape(segments_live(conversation=compacted))
    assert not replay_pending(imported)


def test_the_catch_up_sweep_replays_a_transcript_imported_without_its_replay(owner, compacted):
    imported = import_(owner, export(owner, compacted))  # as one imported before the import queued it
    assert not SummarySegment.objects.filter(conversation=imported).exists()

    assert compaction_catch_up()["replays"] == 1
    assert shape(segments_live(conversation=imported)) == shape(segments_live(conversation=compacted))
    assert compaction_catch_up()["replays"] == 0


def test_a_compaction_before_the_replay_keeps_the_imported_summaries(owner, compacted):
    imported = import_(owner, export(owner, compacted))
    history(imported, 20, start=100)

    compaction_run(conversation=imported, trigger="manual")
    replayed = SummarySegment.objects.filter(conversation=imported, metadata__replayed_from__isnull=False)
    assert replayed.count() == SummarySegment.objects.filter(conversation=compacted).count()
    assert not replay_pending(imported)


def test_a_seed_style_boundary_without_end_seq_starts_the_history_after_itself(owner):
    lines = [
        {
            "uuid": "a",
            "parentUuid": None,
            "role": "user",
            "content": "old question",
            "timestamp": 1700000000000,
        },
        {
            "uuid": "b",
            "parentUuid": "a",
            "role": "assistant",
            "content": "old answer",
            "timestamp": 1700000001000,
        },
        {
            "uuid": "c",
            "parentUuid": "b",
            "type": "system",
            "subtype": "compact_boundary",
            "role": "system",
            "content": "Conversation compacted",
            "compactMetadata": {"trigger": "auto", "preTokens": 155727},
        },
        {
            "uuid": "d",
            "parentUuid": "c",
            "role": "user",
            "content": "Earlier: a question.",
            "isCompactSummary": True,
        },
        {"uuid": "e", "parentUuid": "d", "role": "user", "content": "new question"},
    ]
    data = "\n".join(json.dumps(line) for line in lines).encode()
    imported = import_(owner, data)
    assert history_start_seq(imported) == 3
    body = context(owner, imported)
    assert [i["seq"] for i in body["blocks"]["B6"]["items"]] == [5]
    assert "B4" not in body["blocks"]  # a summary record without segment metadata is not guessed at
