"""Writing what a compaction run made, in one transaction: the compact_boundary and compact_summary records
(refused when another run moved the boundary first), the segments, the compaction state, and the outcome
announced on commit."""

import time
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from conversations.models import Conversation, Message
from conversations.services import compaction_records_append
from summaries.models import CompactionState, SummarySegment
from summaries.selectors import END_SEQ_KEY, boundary_last
from summaries.services.compaction.plan import Plan
from summaries.services.compaction.records import BOUNDARY_TEXT, publish, segment_data, summary_record
from summaries.signals import boundary_moved

_SOURCE_RANK = {"llm": 0, "extractive": 1, "truncation": 2}


class CompactionStale(Exception):
    """The boundary moved while this compaction ran (another run got there first): nothing was written."""


@dataclass
class CompactionOutcome:
    trigger: str
    source: str
    start_seq: int
    end_seq: int
    tokens_before: int
    tokens_after: int
    segments: list[SummarySegment]
    rollups: list[SummarySegment]
    superseded: list[str]
    boundary: Message
    attachments: list[dict[str, Any]]
    messages_summarised: int
    messages_kept: int
    skipped_incomplete: int
    range_tokens: int
    elapsed_ms: float
    degradations: list[dict[str, str]] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return round(self.tokens_after / self.tokens_before, 4) if self.tokens_before else 1.0


@dataclass
class RunResult:
    """What a compaction run made, before it is written: new segments and roll-ups (unsaved), the live
    segments they replace, and the figures its records and outcome report."""

    plan: Plan
    trigger: str
    live_before: list[SummarySegment]
    new: list[SummarySegment]
    rollups: list[SummarySegment]
    replaced: list[SummarySegment]
    tokens_before: int
    attachments: list[dict[str, Any]]
    degradations: list[dict[str, str]]

    @property
    def written(self) -> list[SummarySegment]:
        return [*self.new, *self.rollups]

    @property
    def source(self) -> str:
        return max((s.source for s in self.new), key=lambda s: _SOURCE_RANK[s])

    @property
    def tokens_after(self) -> int:
        live_after = (
            [s for s in self.live_before if s not in self.replaced]
            + [s for s in self.new if s not in self.replaced]
            + self.rollups
        )
        return sum(s.token_count for s in live_after) + self.plan.kept_tokens

    def supersedes(self, segment: SummarySegment) -> list[str]:
        """The ids of the segments a roll-up replaces (none for a new level-0 segment)."""
        return [str(s.id) for s in self.replaced if s.superseded_by_id == segment.id]


def result_write(conversation: Conversation, result: RunResult, *, started: float) -> CompactionOutcome:
    """Write the records, the segments and the state (inside the caller's transaction) and announce the
    outcome on commit; its elapsed time runs from `started` (perf_counter) to the written state.
    CompactionStale when the boundary moved past the plan's cut."""
    boundary = _records_write(conversation, result)
    _segments_save(result)
    _state_record(conversation, result)
    elapsed_ms = round((time.perf_counter() - started) * 1000, 1)
    outcome = _outcome(result, boundary, elapsed_ms=elapsed_ms)
    _announce(conversation, result, outcome)
    return outcome


def _check_cut(expected: int):
    def check(locked: Conversation) -> None:
        if boundary_last(locked)[1] != expected:
            raise CompactionStale(str(locked.pk))

    return check


def _records_write(conversation: Conversation, result: RunResult) -> Message:
    """The compact_boundary record and one compact_summary record per written segment, appended to the
    transcript (refused when the history moved past the plan's cut); the segments learn their seqs. Returns
    the boundary."""
    plan = result.plan
    boundary_meta = {
        "trigger": result.trigger,
        "preTokens": result.tokens_before,
        "postTokens": result.tokens_after,
        "startSeq": plan.start_seq,
        END_SEQ_KEY: plan.end_seq,
        "source": result.source,
        "messagesSummarised": plan.messages,
        "filesIncluded": [a["name"] for a in result.attachments],
    }
    if plan.skipped_incomplete:
        boundary_meta["skippedIncomplete"] = plan.skipped_incomplete
    boundary_record: dict[str, Any] = {
        "role": Message.Role.SYSTEM,
        "kind": Message.Kind.COMPACT_BOUNDARY,
        "content": BOUNDARY_TEXT,
        "metadata": boundary_meta,
        # Idempotent by (conversation, end_seq): a second compaction to the same point cannot be written.
        "idempotency_key": f"compaction:{plan.end_seq}",
    }
    messages = compaction_records_append(
        conversation=conversation,
        records=[boundary_record]
        + [summary_record(s, supersedes=result.supersedes(s)) for s in result.written],
        check=_check_cut(plan.cut),
    )
    boundary = messages[0]
    for segment, message in zip(result.written, messages[1:], strict=True):
        segment.boundary_seq = boundary.seq
        segment.summary_seq = message.seq
    return boundary


def _segments_save(result: RunResult) -> None:
    # Roll-ups first: the segments they replace point at them.
    SummarySegment.objects.bulk_create(result.rollups)
    SummarySegment.objects.bulk_create(result.new)
    for segment in result.replaced:
        if segment in result.live_before:
            SummarySegment.objects.filter(pk=segment.pk).update(superseded_by=segment.superseded_by)


def _state_record(conversation: Conversation, result: RunResult) -> None:
    state, _ = CompactionState.objects.get_or_create(conversation=conversation)
    CompactionState.objects.filter(pk=state.pk).update(
        last_end_seq=result.plan.end_seq,
        last_run_at=timezone.now(),
        last_source=result.source,
        last_error="",
        compactions=state.compactions + 1,
    )


def _outcome(result: RunResult, boundary: Message, *, elapsed_ms: float) -> CompactionOutcome:
    plan = result.plan
    return CompactionOutcome(
        trigger=result.trigger,
        source=result.source,
        start_seq=plan.start_seq,
        end_seq=plan.end_seq,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        segments=result.new,
        rollups=result.rollups,
        superseded=[str(s.id) for s in result.replaced],
        boundary=boundary,
        attachments=result.attachments,
        messages_summarised=plan.messages - plan.skipped_incomplete,
        messages_kept=plan.kept,
        skipped_incomplete=plan.skipped_incomplete,
        range_tokens=plan.range_tokens,
        elapsed_ms=elapsed_ms,
        degradations=result.degradations,
    )


def _announce(conversation: Conversation, result: RunResult, outcome: CompactionOutcome) -> None:
    """summary.updated per written segment and compaction.completed to the conversation's sockets, and
    boundary_moved to the apps that follow the boundary, all on commit."""
    for segment in result.written:
        publish(
            conversation,
            "summary.updated",
            {
                "reason": "rollup" if segment in result.rollups else "compaction",
                "segment": segment_data(segment),
                "supersedes": result.supersedes(segment),
            },
        )
    publish(conversation, "compaction.completed", outcome_data(outcome))
    boundary_seq, end_seq = outcome.boundary.seq, result.plan.end_seq
    transaction.on_commit(
        lambda: boundary_moved.send(
            sender=SummarySegment,
            conversation_id=conversation.id,
            boundary_seq=boundary_seq,
            end_seq=end_seq,
            trigger=result.trigger,
        ),
        robust=True,
    )


def outcome_data(outcome: CompactionOutcome) -> dict[str, Any]:
    """A compaction's outcome as /compact answers it and compaction.completed sends it."""
    return {
        "trigger": outcome.trigger,
        "source": outcome.source,
        "tokens_before": outcome.tokens_before,
        "tokens_after": outcome.tokens_after,
        "ratio": outcome.ratio,
        "boundary": {
            "id": str(outcome.boundary.id),
            "seq": outcome.boundary.seq,
            "start_seq": outcome.start_seq,
            "end_seq": outcome.end_seq,
        },
        "segment": segment_data(outcome.segments[-1]),
        "segments": [segment_data(s) for s in outcome.segments],
        "rollups": [segment_data(s) for s in outcome.rollups],
        "superseded": outcome.superseded,
        "attachments": outcome.attachments,
        "messages_summarised": outcome.messages_summarised,
        "messages_kept": outcome.messages_kept,
        "skipped_incomplete": outcome.skipped_incomplete,
        "elapsed_ms": outcome.elapsed_ms,
        "degradations": outcome.degradations,
    }
