"""Compaction as a service: what it summarises, what it writes into the transcript, what it never touches,
the fact check, roll-ups, the fallback chain, idempotency and the per-conversation lock."""

import itertools

import pytest
from django.test import override_settings

from conversations.models import Message
from providers.tokens import count_text
from summaries.conf import compaction_config
from summaries.locks import LockBusy, compaction_lock
from summaries.models import CompactionState, SummarySegment
from summaries.prompts import TEMPLATE_VERSION
from summaries.selectors import history_start_seq, segment_prompt_text, segments_live
from summaries.services import CompactionStale, compaction_plan, compaction_run
from summaries.services.compaction import records as compaction_records
from summaries.services.compaction import run as compaction_run_module
from summaries.services.compaction import write as compaction_write
from tests.summaries.helpers import append, b6_tokens, budgets, history

pytestmark = pytest.mark.django_db


def kinds(conversation):
    return list(
        Message.objects.filter(conversation=conversation).order_by("seq").values_list("kind", flat=True)
    )


def test_compaction_summarises_all_but_the_newest_fifth_and_deletes_nothing(conversation):
    history(conversation, 30)  # seqs 1..60
    total = b6_tokens(conversation, 0)
    outcome = compaction_run(conversation=conversation, trigger="manual")

    # The raw transcript is intact; a boundary and a summary were appended after it.
    assert kinds(conversation) == ["message"] * 60 + ["compact_boundary", "compact_summary"]
    boundary = Message.objects.get(conversation=conversation, kind="compact_boundary")
    summary = Message.objects.get(conversation=conversation, kind="compact_summary")
    assert (boundary.seq, summary.seq) == (61, 62)
    assert boundary.role == "system" and boundary.content == "Conversation compacted"
    assert boundary.idempotency_key == f"compaction:{outcome.end_seq}"
    assert boundary.metadata["endSeq"] == outcome.end_seq
    assert boundary.metadata["trigger"] == "manual"
    assert boundary.metadata["preTokens"] == outcome.tokens_before
    assert boundary.metadata["postTokens"] == outcome.tokens_after

    # B6 resumes after the last summarised message, not after the boundary record.
    assert history_start_seq(conversation) == outcome.end_seq
    kept = b6_tokens(conversation, outcome.end_seq)
    assert total * 0.2 <= kept <= total * 0.5
    first_kept = Message.objects.get(conversation=conversation, seq=outcome.end_seq + 1)
    assert first_kept.role == "user"  # whole exchanges are kept

    (segment,) = segments_live(conversation=conversation)
    assert (segment.start_seq, segment.end_seq, segment.level) == (1, outcome.end_seq, 0)
    assert segment.source == "extractive" and segment.built_from == "raw"
    assert segment.template_version == TEMPLATE_VERSION
    assert segment.token_count == count_text(segment_prompt_text(segment), model=conversation.model)
    assert (segment.boundary_seq, segment.summary_seq) == (61, 62)
    assert summary.content == segment.text
    assert summary.metadata["segment"]["id"] == str(segment.id)
    assert outcome.tokens_after < outcome.tokens_before
    assert CompactionState.objects.get(pk=conversation.pk).compactions == 1


def test_the_fact_check_re_adds_what_the_summary_lost_and_stores_the_counts(conversation, monkeypatch):
    history(conversation, 20)
    monkeypatch.setattr(
        "summaries.services.summarise.summarise",
        lambda *args, **kwargs: "- User: some things were discussed.",
    )
    outcome = compaction_run(conversation=conversation, trigger="manual")
    (segment,) = outcome.segments
    assert segment.text.startswith("- User: some things were discussed.\nKey facts (verbatim): ")
    assert segment.facts_checked >= 8
    assert segment.facts_missing == segment.facts_checked
    assert segment.metadata["facts_unrecovered"] == 0
    summarised = Message.objects.filter(conversation=conversation, seq__lte=outcome.end_seq, kind="message")
    for n in range(0, 20, 5):
        if summarised.filter(content__contains=f"services/module_{n}/handler.py").exists():
            assert f"services/module_{n}/handler.py" in segment.text
            assert f"port {8000 + n}" in segment.text
    assert "Dana Whitfield" in segment.text


def test_the_summary_names_the_files_that_mattered(conversation):
    history(conversation, 20)
    append(
        conversation,
        {
            "role": "assistant",
            "content": "Writing the config.",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "c1",
                    "name": "write_file",
                    "arguments": {"path": "deploy/app.toml"},
                }
            ],
        },
        {
            "role": "tool",
            "content": "ok",
            "parts": [{"type": "tool_result", "tool_call_id": "c1", "content": "ok"}],
        },
    )
    history(conversation, 20, start=100)
    outcome = compaction_run(conversation=conversation, trigger="manual")
    names = [a["name"] for a in outcome.attachments]
    assert names[0] == "deploy/app.toml"  # written by a tool: first
    assert "services/module_0/handler.py" in names
    assert "deploy/app.toml" in outcome.segments[0].text


def test_only_completed_messages_are_summarised_and_a_streaming_reply_stops_the_range(conversation):
    history(conversation, 10)
    (old_cut_off,) = append(
        conversation, {"role": "assistant", "content": "HALF-WRITTEN REPLY", "completed": False}
    )
    Message.objects.filter(pk=old_cut_off.pk).update(created_at=old_cut_off.created_at.replace(year=2020))
    history(conversation, 10, start=10)
    (streaming,) = append(
        conversation, {"role": "assistant", "content": "STILL STREAMING", "completed": False}
    )
    history(conversation, 10, start=20)

    outcome = compaction_run(conversation=conversation, trigger="manual")
    assert outcome.end_seq < streaming.seq  # the range stops before a reply that may still be streaming
    assert outcome.skipped_incomplete == 1  # the stale cut-off one is passed, never summarised
    assert "HALF-WRITTEN" not in outcome.segments[0].text
    assert outcome.messages_summarised == outcome.end_seq - 1


def test_the_kept_history_never_starts_with_a_tool_result(conversation):
    for n in range(12):
        append(
            conversation,
            {"role": "user", "content": f"step {n}: please continue with the migration of table_{n}"},
            {
                "role": "assistant",
                "content": "",
                "parts": [
                    {"type": "tool_call", "id": f"c{n}", "name": "run_sql", "arguments": {"q": f"select {n}"}}
                ],
            },
            {
                "role": "tool",
                "content": f"{n} rows migrated",
                "parts": [
                    {
                        "type": "tool_result",
                        "tool_call_id": f"c{n}",
                        "content": f"{n} rows migrated into table_{n}",
                    }
                ],
            },
        )
    outcome = compaction_run(conversation=conversation, trigger="manual")
    first_kept = Message.objects.get(conversation=conversation, seq=outcome.end_seq + 1)
    assert first_kept.role != "tool"


def test_nothing_to_compact_in_a_short_history(conversation):
    assert compaction_run(conversation=conversation, trigger="manual") is None
    append(conversation, {"role": "user", "content": "hello"})
    assert compaction_run(conversation=conversation, trigger="manual") is None
    assert kinds(conversation) == ["message"]


def test_a_second_compaction_summarises_only_what_came_after_the_first(conversation):
    history(conversation, 20)
    first = compaction_run(conversation=conversation, trigger="manual")
    history(conversation, 20, start=20)
    second = compaction_run(conversation=conversation, trigger="auto")
    assert second.start_seq == first.end_seq + 1  # from raw messages after the boundary, never from summaries
    live = segments_live(conversation=conversation)
    assert [(s.start_seq, s.end_seq) for s in live] == [
        (1, first.end_seq),
        (first.end_seq + 1, second.end_seq),
    ]
    assert history_start_seq(conversation) == second.end_seq
    assert kinds(conversation).count("compact_boundary") == 2


def test_a_compaction_that_lost_the_race_writes_nothing(conversation):
    history(conversation, 20)
    cfg = compaction_config(conversation)
    plan = compaction_plan(conversation, cfg)
    compaction_run(conversation=conversation, trigger="auto")  # another run moves the boundary first
    before = kinds(conversation)
    with pytest.raises(CompactionStale):
        compaction_run_module._run(conversation, plan, cfg, trigger="auto", sync=False)
    assert kinds(conversation) == before
    assert SummarySegment.objects.filter(conversation=conversation).count() == 1


def test_one_compaction_per_conversation_at_a_time(conversation):
    history(conversation, 20)
    with compaction_lock(conversation.pk, ttl=60):
        with pytest.raises(LockBusy):
            compaction_run(conversation=conversation, trigger="manual")
        with pytest.raises(LockBusy), compaction_lock(conversation.pk, ttl=60):
            pass
    assert compaction_run(conversation=conversation, trigger="manual") is not None


def test_segments_over_the_b4_budget_are_rolled_up_from_their_raw_messages(owner, conversation):
    budgets(owner.tenant, summary=300)
    conversation.refresh_from_db()
    for round_ in range(3):
        history(conversation, 20, start=round_ * 20)
        compaction_run(conversation=conversation, trigger="auto")
    live = segments_live(conversation=conversation)
    rollup = next(s for s in live if s.level > 0)
    assert rollup.built_from == "raw"
    replaced = list(SummarySegment.objects.filter(superseded_by=rollup).order_by("start_seq"))
    assert len(replaced) >= 2
    assert rollup.start_seq == replaced[0].start_seq and rollup.end_seq == replaced[-1].end_seq
    assert sorted(rollup.metadata["rolled_up"]) == sorted(str(s.id) for s in replaced)
    # Live segments tile the summarised range without overlap.
    ranges = [(s.start_seq, s.end_seq) for s in live]
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))
    # The transcript records the roll-up and what it replaced.
    record = Message.objects.get(conversation=conversation, kind="compact_summary", seq=rollup.summary_seq)
    assert sorted(record.metadata["supersedes"]) == sorted(str(s.id) for s in replaced)


@override_settings(MNEMO_SUMMARISER_MAX_INPUT_TOKENS=600)
def test_long_ranges_are_split_and_rolled_up_from_segments_when_raw_does_not_fit(owner, conversation):
    budgets(owner.tenant, summary=250)
    conversation.refresh_from_db()
    history(conversation, 40)
    outcome = compaction_run(conversation=conversation, trigger="manual")
    assert len(outcome.segments) >= 2  # the range did not fit the summariser's input at once
    assert outcome.rollups and outcome.rollups[0].built_from == "segments"


def test_when_no_summary_can_be_made_the_newest_30_percent_is_kept(conversation, monkeypatch):
    history(conversation, 30)
    total = b6_tokens(conversation, 0)

    def broken(*args, **kwargs):
        raise RuntimeError("summariser bug")

    monkeypatch.setattr("summaries.services.summarise.summarise", broken)
    outcome = compaction_run(conversation=conversation, trigger="auto")
    (segment,) = outcome.segments
    assert segment.source == outcome.source == "truncation"
    assert "left out of the prompt" in segment.text
    assert b6_tokens(conversation, outcome.end_seq) >= total * 0.3
    assert [d["code"] for d in outcome.degradations] == ["summary_failed"]
    assert Message.objects.filter(conversation=conversation, kind="message").count() == 60


def test_compaction_events_are_published_in_order(conversation, monkeypatch):
    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(
        compaction_records, "event_publish", lambda **kw: sent.append((kw["event"], kw["data"]))
    )
    history(conversation, 20)
    outcome = compaction_run(conversation=conversation, trigger="manual")
    assert [e for e, _ in sent] == ["compaction.started", "summary.updated", "compaction.completed"]
    assert sent[1][1]["segment"]["id"] == str(outcome.segments[0].id)
    assert sent[2][1]["tokens_after"] == outcome.tokens_after


def test_a_failure_is_recorded_and_published(conversation, monkeypatch):
    sent: list[str] = []
    monkeypatch.setattr(compaction_records, "event_publish", lambda **kw: sent.append(kw["event"]))

    def broken(*args, **kwargs):
        raise ValueError("disk full")

    monkeypatch.setattr(compaction_write, "compaction_records_append", broken)
    history(conversation, 20)
    with pytest.raises(ValueError):
        compaction_run(conversation=conversation, trigger="auto")
    assert sent[-1] == "compaction.failed"
    state = CompactionState.objects.get(pk=conversation.pk)
    assert state.failures == 1 and "disk full" in state.last_error


def test_the_core_memory_hook_fires_after_the_boundary_moves(
    conversation, django_capture_on_commit_callbacks
):
    from summaries.signals import boundary_moved

    received: list[dict] = []

    def receiver(sender, **kwargs):
        received.append(kwargs)

    boundary_moved.connect(receiver)
    try:
        history(conversation, 20)
        with django_capture_on_commit_callbacks(execute=True):
            outcome = compaction_run(conversation=conversation, trigger="manual")
    finally:
        boundary_moved.disconnect(receiver)
    (call,) = received
    assert call["conversation_id"] == conversation.id
    assert (call["boundary_seq"], call["end_seq"], call["trigger"]) == (
        outcome.boundary.seq,
        outcome.end_seq,
        "manual",
    )


def test_the_budgets_a_request_asked_for_size_later_runs_and_never_exceed_the_configured_ones(
    conversation,
):
    from summaries.conf import compaction_config_requested
    from summaries.services import compaction_request

    configured = compaction_config(conversation)
    assert compaction_config_requested(conversation) == configured  # nothing asked yet

    assert compaction_request(conversation=conversation, history_budget=4000, summary_budget=300)
    asked = compaction_config_requested(conversation)
    assert (asked.history_budget, asked.summary_budget) == (4000, 300)
    assert asked.segment_cap == 100 and configured.segment_cap == configured.summary_budget // 3

    # A trigger without budgets (the catch-up sweep, an operator) keeps what the client asked for.
    CompactionState.objects.filter(pk=conversation.pk).update(queued_at=None)
    assert compaction_request(conversation=conversation, trigger="catch-up")
    assert compaction_config_requested(conversation).summary_budget == 300

    # More than the tenant's budgets is capped by them.
    CompactionState.objects.filter(pk=conversation.pk).update(queued_at=None)
    compaction_request(conversation=conversation, history_budget=10**6, summary_budget=10**6)
    capped = compaction_config_requested(conversation)
    assert (capped.history_budget, capped.summary_budget) == (
        configured.history_budget,
        configured.summary_budget,
    )


def test_a_segment_names_the_speakers_and_the_days_it_covers(conversation):
    from datetime import UTC, datetime, timedelta

    from summaries.selectors import segment_prompt_text

    day = datetime(2023, 5, 8, 12, tzinfo=UTC)
    append(
        conversation,
        *[
            {
                "role": "user",
                "name": "Priya" if n % 2 else "Tomas",
                "content": f"Trip note {n}: the ferry to island {n} leaves at {n + 6} in the morning.",
                "created_at": day + timedelta(days=n // 20),
            }
            for n in range(60)
        ],
    )

    compaction_run(conversation=conversation, trigger="manual", sync=True)

    segment = SummarySegment.objects.get(conversation=conversation)
    assert "Priya: " in segment.text or "Tomas: " in segment.text
    assert "User:" not in segment.text
    assert segment_prompt_text(segment).startswith(f"[Messages 1–{segment.end_seq}, 2023-05-08 to 2023-05-")
