"""Compaction: summarise the oldest messages of B6 (all but the newest share by tokens) into a new B4
segment, write a compact_boundary and compact_summary messages into the transcript, and move the boundary.
Raw messages are never touched. Segments are made from raw messages only; when live segments outgrow the
B4 budget the oldest are rolled up (from their raw messages when those fit the summariser's input,
otherwise from the segments, and the roll-up records which).

Entry points: compaction_run (the request path and /compact, under the lock), compaction_request (queue a
background run; duplicates collapse), compaction_run_queued (the Celery task's body),
compaction_catch_up (beat), segment_rebuild (resummarize), segments_replay (after a transcript import).
"""

import bisect
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Min, Q, Sum
from django.utils import timezone

from conversations.events import event_publish
from conversations.models import Conversation, Message
from conversations.services import compaction_records_append
from providers.background import task_send
from providers.summariser import SourceMessage
from providers.tokens import count_text
from summaries.conf import CompactionConfig, compaction_config_requested
from summaries.locks import compaction_lock
from summaries.models import CompactionState, SummarySegment
from summaries.prompts import TEMPLATE_VERSION
from summaries.selectors import END_SEQ_KEY, boundary_last, segment_prompt_text, segments_live
from summaries.services.summarise import (
    SummaryText,
    named_attachments,
    source_messages,
    summary_make,
    target_tokens_for,
)
from summaries.signals import boundary_moved

logger = logging.getLogger(__name__)

BOUNDARY_TEXT = "Conversation compacted"
TRUNCATION_TEXT = (
    "(No summary could be made of messages {start}–{end}; they are left out of the prompt and remain in "
    "the transcript.)"
)
_SOURCE_RANK = {"llm": 0, "extractive": 1, "truncation": 2}


class CompactionStale(Exception):
    """The boundary moved while this compaction ran (another run got there first): nothing was written."""


@dataclass
class Plan:
    cut: int  # B6 currently resumes after this seq
    start_seq: int
    end_seq: int  # the new cut
    b6_tokens: int
    range_tokens: int
    kept_tokens: int
    messages: int  # kind=message rows in the range
    kept: int
    skipped_incomplete: int


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


# --- planning -----------------------------------------------------------------------------------------------


def history_tokens(conversation: Conversation, *, cut: int | None = None) -> int:
    """Tokens of B6: the messages after the last boundary (`cut`, when the caller has read it already)."""
    cut = boundary_last(conversation)[1] if cut is None else cut
    total = Message.objects.filter(
        conversation=conversation, kind=Message.Kind.MESSAGE, seq__gt=cut
    ).aggregate(tokens=Sum("token_count"))["tokens"]
    return total or 0


def compaction_plan(
    conversation: Conversation, cfg: CompactionConfig, *, keep: float | None = None
) -> Plan | None:
    """Which messages the next compaction summarises: the oldest of B6, keeping the newest `keep` share by
    tokens. The kept part never starts with a tool result (its call stays with it), starts at a user message
    when that keeps at most half of B6, and the range stops before an incomplete message that may still be
    streaming. None when there is nothing worth compacting."""
    keep = cfg.keep if keep is None else keep
    cut = boundary_last(conversation)[1]
    rows = list(
        Message.objects.filter(conversation=conversation, kind=Message.Kind.MESSAGE, seq__gt=cut)
        .order_by("seq")
        .values_list("seq", "token_count", "role", "completed", "created_at")
    )
    if len(rows) < 2:
        return None
    total = sum(r[1] for r in rows)
    kept = 0
    split = len(rows)
    while split > 0 and kept < total * keep:
        split -= 1
        kept += rows[split][1]
    split = min(max(1, split), len(rows) - 1)  # keep at least the newest message, summarise at least one
    while split > 0 and rows[split][2] == Message.Role.TOOL:
        split -= 1
    if split > 0 and rows[split][2] != Message.Role.USER:
        # Prefer to keep whole exchanges: start at the user message before, if that keeps at most half.
        index, kept_if = split, sum(r[1] for r in rows[split:])
        while index > 1:
            index -= 1
            kept_if += rows[index][1]
            if kept_if > total * 0.5:
                break
            if rows[index][2] == Message.Role.USER:
                split = index
                break
    grace = timezone.now() - timedelta(seconds=cfg.incomplete_grace_seconds)
    for index in range(split):
        _, _, _, completed, created_at = rows[index]
        if not completed and created_at > grace:
            split = index
            break
    summarised = rows[:split]
    if not summarised or not any(r[3] for r in summarised):
        return None
    return Plan(
        cut=cut,
        start_seq=summarised[0][0],
        end_seq=summarised[-1][0],
        b6_tokens=total,
        range_tokens=sum(r[1] for r in summarised),
        kept_tokens=sum(r[1] for r in rows[split:]),
        messages=len(summarised),
        kept=len(rows) - split,
        skipped_incomplete=sum(1 for r in summarised if not r[3]),
    )


def _raw_messages(conversation: Conversation, start_seq: int, end_seq: int) -> list[Message]:
    """The completed raw messages of a range: the only input a summary is ever made from."""
    return list(
        Message.objects.filter(
            conversation=conversation,
            kind=Message.Kind.MESSAGE,
            completed=True,
            seq__gte=start_seq,
            seq__lte=end_seq,
        ).order_by("seq")
    )


def _chunks(messages: list[Message], limit: int) -> list[list[Message]]:
    chunks: list[list[Message]] = [[]]
    used = 0
    for message in messages:
        if chunks[-1] and used + message.token_count > limit:
            chunks.append([])
            used = 0
        chunks[-1].append(message)
        used += message.token_count
    return [c for c in chunks if c]


# --- building segments --------------------------------------------------------------------------------------


def _segment(
    conversation: Conversation,
    *,
    start_seq: int,
    end_seq: int,
    level: int,
    summary: SummaryText | None,
    built_from: str,
    extra: dict[str, Any] | None = None,
) -> SummarySegment:
    source: str
    if summary is None:
        text = TRUNCATION_TEXT.format(start=start_seq, end=end_seq)
        source, model, metadata = SummarySegment.Source.TRUNCATION, "", {}
        facts_checked = facts_missing = 0
    else:
        text, source, model = summary.text, summary.source, summary.model
        facts_checked, facts_missing = summary.facts_checked, summary.facts_missing
        metadata = {
            "facts_added": summary.facts_added,
            "facts_unrecovered": summary.facts_unrecovered,
            "attachments": summary.attachments,
            "degradations": summary.degradations,
            "input_tokens": summary.input_tokens,
        }
    metadata.update(_days(conversation, start_seq, end_seq))
    segment = SummarySegment(
        conversation=conversation,
        start_seq=start_seq,
        end_seq=end_seq,
        level=level,
        text=text,
        source=source,
        built_from=built_from,
        model=model,
        template_version=TEMPLATE_VERSION,
        facts_checked=facts_checked,
        facts_missing=facts_missing,
        metadata={**metadata, **(extra or {})},
    )
    segment.token_count = count_text(segment_prompt_text(segment), model=conversation.model)
    return segment


def _days(conversation: Conversation, start_seq: int, end_seq: int) -> dict[str, str]:
    """The first and last day of the messages a segment covers (B4 says which dates it holds)."""
    span = Message.objects.filter(
        conversation=conversation, seq__gte=start_seq, seq__lte=end_seq, kind=Message.Kind.MESSAGE
    ).aggregate(first=Min("created_at"), last=Max("created_at"))
    if span["first"] is None:
        return {}
    return {"first_day": span["first"].date().isoformat(), "last_day": span["last"].date().isoformat()}


def _summarise_raw(
    conversation: Conversation,
    messages: list[Message],
    *,
    target_tokens: int,
    cfg: CompactionConfig,
    instructions: str,
    sync: bool,
) -> SummaryText:
    sources = source_messages(messages)
    return summary_make(
        conversation=conversation,
        sources=sources,
        fact_source="\n".join(s.text for s in sources),
        attachments=named_attachments(messages),
        target_tokens=target_tokens,
        cfg=cfg,
        instructions=instructions,
        sync=sync,
    )


def _rollups(
    conversation: Conversation, live: list[SummarySegment], cfg: CompactionConfig, *, sync: bool
) -> tuple[list[SummarySegment], list[SummarySegment]]:
    """Roll up the oldest live segments while B4 is over its budget. Returns (roll-ups, segments they
    replace). Each roll-up covers at least two segments."""
    rollups: list[SummarySegment] = []
    replaced: list[SummarySegment] = []
    live = list(live)
    while sum(s.token_count for s in live) > cfg.summary_budget and len(live) >= 2:
        group, built_from, raw_tokens = _rollup_group(conversation, live, cfg)
        group_tokens = sum(s.token_count for s in group)
        target = max(64, min(group_tokens // 2, cfg.segment_cap, cfg.segment_max_tokens * 2))
        start, end = group[0].start_seq, group[-1].end_seq
        if built_from == SummarySegment.BuiltFrom.RAW:
            summary = _summarise_raw(
                conversation,
                _raw_messages(conversation, start, end),
                target_tokens=target,
                cfg=cfg,
                instructions="",
                sync=sync,
            )
        else:
            summary = _summarise_segments(conversation, group, target_tokens=target, cfg=cfg, sync=sync)
        rollup = _segment(
            conversation,
            start_seq=start,
            end_seq=end,
            level=max(s.level for s in group) + 1,
            summary=summary,
            built_from=built_from,
            extra={"rolled_up": [str(s.id) for s in group], "raw_tokens": raw_tokens},
        )
        if rollup.token_count >= group_tokens:
            break  # nothing gained; the budget stage drops the oldest from the prompt instead
        for s in group:
            s.superseded_by = rollup
        rollups.append(rollup)
        replaced += group
        live = [rollup, *live[len(group) :]]
    return rollups, replaced


def _rollup_group(
    conversation: Conversation, live: list[SummarySegment], cfg: CompactionConfig
) -> tuple[list[SummarySegment], str, int]:
    """(the oldest live segments to roll up into one, what to build it from, their raw messages' tokens):
    from raw messages, as many segments as the summariser's input and half of B4's budget allow (at least
    two); from the two oldest segments' texts when even their raw messages are too many."""
    group = live[:2]
    raw_tokens = _range_tokens(conversation, group[0].start_seq, group[-1].end_seq)
    if raw_tokens > cfg.max_input_tokens:
        return group, SummarySegment.BuiltFrom.SEGMENTS, raw_tokens
    for candidate in live[2:]:
        more = _range_tokens(conversation, group[0].start_seq, candidate.end_seq)
        if more > cfg.max_input_tokens or sum(s.token_count for s in group) > cfg.summary_budget // 2:
            break
        group.append(candidate)
        raw_tokens = more
    return group, SummarySegment.BuiltFrom.RAW, raw_tokens


def _summarise_segments(
    conversation: Conversation,
    segments: list[SummarySegment],
    *,
    target_tokens: int,
    cfg: CompactionConfig,
    sync: bool,
) -> SummaryText:
    """One summary of the segments' texts (a roll-up whose raw messages are more than the summariser
    reads)."""
    return summary_make(
        conversation=conversation,
        sources=[SourceMessage(seq=s.start_seq, role="system", text=s.text) for s in segments],
        fact_source="\n".join(s.text for s in segments),
        attachments=[],
        target_tokens=target_tokens,
        cfg=cfg,
        sync=sync,
    )


def _range_tokens(conversation: Conversation, start: int, end: int) -> int:
    return (
        Message.objects.filter(
            conversation=conversation, kind=Message.Kind.MESSAGE, completed=True, seq__gte=start, seq__lte=end
        ).aggregate(tokens=Sum("token_count"))["tokens"]
        or 0
    )


# --- transcript records and events --------------------------------------------------------------------------


def segment_data(segment: SummarySegment) -> dict[str, Any]:
    """A segment as the API and the socket show it."""
    return {
        "id": str(segment.id),
        "start_seq": segment.start_seq,
        "end_seq": segment.end_seq,
        "level": segment.level,
        "source": segment.source,
        "built_from": segment.built_from,
        "model": segment.model,
        "template_version": segment.template_version,
        "token_count": segment.token_count,
        "facts_checked": segment.facts_checked,
        "facts_missing": segment.facts_missing,
        "text": segment.text,
        "superseded_by": str(segment.superseded_by_id) if segment.superseded_by_id else None,
        "created_at": segment.created_at.isoformat().replace("+00:00", "Z"),
    }


def _summary_record(segment: SummarySegment, *, supersedes: list[str]) -> dict[str, Any]:
    return {
        "role": Message.Role.USER,
        "kind": Message.Kind.COMPACT_SUMMARY,
        "content": segment.text,
        "metadata": {
            "segment": {
                "id": str(segment.id),
                "startSeq": segment.start_seq,
                "endSeq": segment.end_seq,
                "level": segment.level,
                "source": segment.source,
                "builtFrom": segment.built_from,
                "model": segment.model,
                "templateVersion": segment.template_version,
                "factsChecked": segment.facts_checked,
                "factsMissing": segment.facts_missing,
            },
            "supersedes": supersedes,
        },
    }


def _publish(conversation: Conversation, event: str, data: dict[str, Any]) -> None:
    event_publish(tenant_id=conversation.tenant_id, conversation_id=conversation.id, event=event, data=data)


def _check_cut(expected: int):
    def check(locked: Conversation) -> None:
        if boundary_last(locked)[1] != expected:
            raise CompactionStale(str(locked.pk))

    return check


# --- one compaction -----------------------------------------------------------------------------------------


def _run(
    conversation: Conversation,
    plan: Plan,
    cfg: CompactionConfig,
    *,
    trigger: str,
    instructions: str = "",
    sync: bool,
) -> CompactionOutcome:
    """Summarise the plan's range into new segments (roll-ups when B4 outgrows its budget; a truncation
    segment when summarising fails), then write the boundary and summary records, the segments and the
    compaction state in one transaction and announce them on commit."""
    started = time.perf_counter()
    live_before = segments_live(conversation=conversation)
    tokens_before = sum(s.token_count for s in live_before) + plan.b6_tokens
    _publish(
        conversation,
        "compaction.started",
        {
            "trigger": trigger,
            "mode": "sync" if sync else "background",
            "tokens_before": tokens_before,
            "start_seq": plan.start_seq,
            "end_seq": plan.end_seq,
        },
    )
    degradations: list[dict[str, str]] = []
    try:
        new = _summarised(
            conversation, plan, cfg, trigger, instructions, sync=sync, degradations=degradations
        )
        rollups, replaced = _rollups(conversation, [*live_before, *new], cfg, sync=sync)
    except Exception as exc:
        # The offline path failed (a bug, not an outage): keep the newest 30 % and leave the rest out of the
        # prompt, recorded as a truncation segment that `resummarize` can turn into a summary later.
        logger.exception("summarising %s failed; falling back to truncation", conversation.id)
        plan, new = _truncated(conversation, plan, cfg, exc, trigger=trigger, degradations=degradations)
        rollups, replaced = [], []
    result = _Result(
        plan=plan,
        trigger=trigger,
        live_before=live_before,
        new=new,
        rollups=rollups,
        replaced=replaced,
        tokens_before=tokens_before,
        attachments=named_attachments(_raw_messages(conversation, plan.start_seq, plan.end_seq)),
        degradations=degradations,
    )
    with transaction.atomic():
        boundary = _records_write(conversation, result)
        _segments_save(result)
        _state_record(conversation, result)
        outcome = _outcome(result, boundary, elapsed_ms=round((time.perf_counter() - started) * 1000, 1))
        _announce(conversation, result, outcome)
    for d in degradations:
        logger.warning("compaction of %s degraded (%s): %s", conversation.id, d["code"], d["message"])
    return outcome


def _summarised(
    conversation: Conversation,
    plan: Plan,
    cfg: CompactionConfig,
    trigger: str,
    instructions: str,
    *,
    sync: bool,
    degradations: list[dict[str, str]],
) -> list[SummarySegment]:
    """One level-0 segment per chunk of the range that fits the summariser's input (unsaved); the summaries'
    degradations are added to `degradations`."""
    new = []
    chunks = _chunks(_raw_messages(conversation, plan.start_seq, plan.end_seq), cfg.max_input_tokens)
    for index, chunk in enumerate(chunks):
        input_tokens = sum(m.token_count for m in chunk)
        summary = _summarise_raw(
            conversation,
            chunk,
            target_tokens=target_tokens_for(input_tokens, cfg),
            cfg=cfg,
            instructions=instructions,
            sync=sync,
        )
        degradations += [d for d in summary.degradations if d not in degradations]
        new.append(
            _segment(
                conversation,
                start_seq=plan.start_seq if index == 0 else chunk[0].seq,
                end_seq=plan.end_seq if index == len(chunks) - 1 else chunk[-1].seq,
                level=0,
                summary=summary,
                built_from=SummarySegment.BuiltFrom.RAW,
                extra={"trigger": trigger, **({"instructions": instructions} if instructions else {})},
            )
        )
    return new


def _truncated(
    conversation: Conversation,
    plan: Plan,
    cfg: CompactionConfig,
    exc: Exception,
    *,
    trigger: str,
    degradations: list[dict[str, str]],
) -> tuple[Plan, list[SummarySegment]]:
    """The fallback when no summary could be made: the plan that keeps the newest cfg.fallback_keep of the
    history, and one truncation segment for what it leaves out of the prompt."""
    degradations.append(
        {
            "code": "summary_failed",
            "message": f"No summary could be made ({type(exc).__name__}): the newest "
            f"{round(cfg.fallback_keep * 100)} % of the history is kept, the rest left out of the "
            "prompt.",
        }
    )
    plan = compaction_plan(conversation, cfg, keep=cfg.fallback_keep) or plan
    segment = _segment(
        conversation,
        start_seq=plan.start_seq,
        end_seq=plan.end_seq,
        level=0,
        summary=None,
        built_from=SummarySegment.BuiltFrom.RAW,
        extra={"trigger": trigger},
    )
    return plan, [segment]


@dataclass
class _Result:
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


def _records_write(conversation: Conversation, result: _Result) -> Message:
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
        + [_summary_record(s, supersedes=result.supersedes(s)) for s in result.written],
        check=_check_cut(plan.cut),
    )
    boundary = messages[0]
    for segment, message in zip(result.written, messages[1:], strict=True):
        segment.boundary_seq = boundary.seq
        segment.summary_seq = message.seq
    return boundary


def _segments_save(result: _Result) -> None:
    # Roll-ups first: the segments they replace point at them.
    SummarySegment.objects.bulk_create(result.rollups)
    SummarySegment.objects.bulk_create(result.new)
    for segment in result.replaced:
        if segment in result.live_before:
            SummarySegment.objects.filter(pk=segment.pk).update(superseded_by=segment.superseded_by)


def _state_record(conversation: Conversation, result: _Result) -> None:
    state, _ = CompactionState.objects.get_or_create(conversation=conversation)
    CompactionState.objects.filter(pk=state.pk).update(
        last_end_seq=result.plan.end_seq,
        last_run_at=timezone.now(),
        last_source=result.source,
        last_error="",
        compactions=state.compactions + 1,
    )


def _outcome(result: _Result, boundary: Message, *, elapsed_ms: float) -> CompactionOutcome:
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


def _announce(conversation: Conversation, result: _Result, outcome: CompactionOutcome) -> None:
    """summary.updated per written segment and compaction.completed to the conversation's sockets, and
    boundary_moved to the apps that follow the boundary, all on commit."""
    for segment in result.written:
        _publish(
            conversation,
            "summary.updated",
            {
                "reason": "rollup" if segment in result.rollups else "compaction",
                "segment": segment_data(segment),
                "supersedes": result.supersedes(segment),
            },
        )
    _publish(conversation, "compaction.completed", outcome_data(outcome))
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


def compaction_failure_record(
    *, conversation: Conversation, trigger: str, exc: BaseException, will_retry: bool = False
) -> None:
    """Count a failed compaction on the conversation's state and publish compaction.failed."""
    now = timezone.now()
    CompactionState.objects.get_or_create(conversation=conversation)
    CompactionState.objects.filter(pk=conversation.pk).update(
        last_error=f"{type(exc).__name__}: {exc}"[:2000],
        last_run_at=now,
        last_failed_at=now,
        failures=F("failures") + 1,
    )
    _publish(
        conversation,
        "compaction.failed",
        {
            "trigger": trigger,
            "error": type(exc).__name__,
            "message": str(exc)[:500],
            "will_retry": will_retry,
        },
    )


def compaction_run(
    *,
    conversation: Conversation,
    trigger: str,
    instructions: str = "",
    sync: bool = True,
    min_tokens: int = 0,
    will_retry: bool = False,
) -> CompactionOutcome | None:
    """Compact now, under the conversation's lock (LockBusy when another run holds it). None when there is
    nothing to compact or B6 holds fewer than `min_tokens`; CompactionStale when another run moved the
    boundary first. A failure is recorded and published (compaction.failed) before it propagates."""
    cfg = compaction_config_requested(conversation)
    with compaction_lock(conversation.pk, ttl=cfg.lock_ttl):
        # Holding the lock, a run still marked as running is one whose worker died.
        compaction_interrupted_record(conversation=conversation, trigger=trigger)
        plan = compaction_plan(conversation, cfg)
        if plan is None or plan.b6_tokens < min_tokens:
            return None
        # Committed before the run (unless a caller's transaction holds it), so a killed worker leaves it.
        CompactionState.objects.get_or_create(conversation=conversation)
        marked = CompactionState.objects.filter(pk=conversation.pk)
        marked.update(running_since=timezone.now())
        try:
            return _run(conversation, plan, cfg, trigger=trigger, instructions=instructions, sync=sync)
        except CompactionStale:
            raise
        except Exception as exc:
            compaction_failure_record(
                conversation=conversation, trigger=trigger, exc=exc, will_retry=will_retry
            )
            raise
        finally:
            marked.update(running_since=None)


class CompactionInterrupted(Exception):
    """A compaction run started and never finished: its worker was killed or lost."""


def compaction_interrupted_record(
    *, conversation: Conversation, trigger: str, older_than: timedelta | None = None
) -> bool:
    """Record a failure for a run marked as running (since before `older_than` ago) that is not running any
    more, and clear its mark. The caller knows it is dead: it holds the lock, or the mark is older than any
    run may last. Returns whether there was one."""
    marked = CompactionState.objects.filter(pk=conversation.pk, running_since__isnull=False)
    if older_than is not None:
        marked = marked.filter(running_since__lt=timezone.now() - older_than)
    since = marked.values_list("running_since", flat=True).first()
    if since is None or not marked.filter(running_since=since).update(running_since=None):
        return False
    exc = CompactionInterrupted(f"the run started at {since.isoformat()} did not finish (worker lost)")
    logger.warning("compaction of %s was interrupted: %s", conversation.pk, exc)
    compaction_failure_record(conversation=conversation, trigger=trigger, exc=exc, will_retry=True)
    return True


# --- background ---------------------------------------------------------------------------------------------


def compaction_queued(conversation: Conversation) -> bool:
    """A compaction is queued and not stale (compaction_request would collapse another trigger into it)."""
    stale = timezone.now() - timedelta(seconds=settings.MNEMO_COMPACTION_HARD_TIME_LIMIT * 2)
    return CompactionState.objects.filter(pk=conversation.pk, queued_at__gte=stale).exists()


def compaction_due(conversation: Conversation) -> bool:
    """The history since the last boundary has reached the background share of the budget the client last
    asked for (or the configured one): a compaction should run, whether or not a context call asked."""
    cfg = compaction_config_requested(conversation)
    return history_tokens(conversation) >= cfg.background * cfg.history_budget


def compaction_settled(conversation: Conversation) -> bool:
    """No compaction queued, running or due (readiness). One due and not queued is queued here: a history
    loaded without context calls is compacted without waiting for one, or for the catch-up sweep."""
    running = CompactionState.objects.filter(pk=conversation.pk, running_since__isnull=False).exists()
    if running or compaction_queued(conversation):  # a stale flag (a lost task) is not waited for
        return False
    if not compaction_due(conversation):
        return True
    compaction_request(conversation=conversation, trigger="auto")
    return False


def compaction_request(
    *,
    conversation: Conversation,
    trigger: str = "auto",
    history_budget: int | None = None,
    summary_budget: int | None = None,
) -> bool:
    """Queue a background compaction, unless one is queued already: duplicate triggers collapse into the
    one queued task. The task is sent when the current transaction commits. Returns whether it queued.
    A context request passes the budgets its token_budget gives the history and the summaries: remembered
    for this run and the later ones (compaction_config_requested)."""
    CompactionState.objects.get_or_create(conversation=conversation)
    now = timezone.now()
    stale = now - timedelta(seconds=settings.MNEMO_COMPACTION_HARD_TIME_LIMIT * 2)  # as compaction_queued
    asked = {"history_budget": history_budget, "summary_budget": summary_budget}
    queued = (
        CompactionState.objects.filter(pk=conversation.pk)
        .filter(Q(queued_at__isnull=True) | Q(queued_at__lt=stale))
        .update(queued_at=now, **{k: v for k, v in asked.items() if v is not None})
    )
    if not queued:
        return False
    conversation_id = str(conversation.pk)

    def send() -> None:
        from summaries.tasks import compact_conversation

        if not task_send(compact_conversation, conversation_id, trigger, history_budget):
            # The broker is down (logged): let the next trigger or the catch-up sweep queue it again instead
            # of waiting for the flag to go stale.
            CompactionState.objects.filter(pk=conversation.pk, queued_at=now).update(queued_at=None)

    transaction.on_commit(send, robust=True)
    return True


def compaction_run_queued(
    *,
    conversation_id: uuid.UUID | str,
    trigger: str = "auto",
    history_budget: int | None = None,
    will_retry: bool = False,
) -> str:
    """The body of the background task. Clears the queued flag first (a trigger arriving during the run
    queues the next one), then compacts if B6 still reaches the background threshold. Returns what it did."""
    CompactionState.objects.filter(conversation_id=conversation_id).update(queued_at=None)
    conversation = Conversation.objects.select_related("tenant").filter(pk=conversation_id).first()
    if conversation is None:
        return "gone"
    cfg = compaction_config_requested(conversation)
    budget = min(history_budget or cfg.history_budget, cfg.history_budget)
    min_tokens = 0 if trigger == "manual" else int(cfg.background * budget)
    try:
        outcome = compaction_run(
            conversation=conversation,
            trigger=trigger,
            sync=False,
            min_tokens=min_tokens,
            will_retry=will_retry,
        )
    except CompactionStale:
        return "stale"
    return "compacted" if outcome is not None else "not_needed"


def compaction_catch_up(*, limit: int | None = None) -> dict[str, int]:
    """Periodic (beat), the sweep that loses nothing: record runs whose worker died, then queue compaction
    for recently active conversations and those whose last run failed, when their B6 reached the background
    threshold without a queued task (the broker was down, the task was lost or gave up); and rebuild
    truncation segments."""
    limit = limit or settings.MNEMO_COMPACTION_CATCHUP_LIMIT
    interrupted = _interrupted_sweep(limit)
    since = timezone.now() - timedelta(seconds=settings.MNEMO_COMPACTION_CATCHUP_LOOKBACK_SECONDS)
    queued = 0
    candidates = (
        Conversation.objects.filter(archived_at__isnull=True)
        .filter(
            Q(updated_at__gte=since)
            | Q(compaction_state__last_error__gt="", compaction_state__running_since__isnull=True)
        )
        .select_related("tenant")
        .order_by("-updated_at")[:limit]
    )
    for conversation in candidates:
        if compaction_due(conversation):
            queued += compaction_request(conversation=conversation, trigger="catch-up")
    rebuilt = 0
    old = timezone.now() - timedelta(minutes=5)
    for segment in SummarySegment.objects.filter(
        source=SummarySegment.Source.TRUNCATION, superseded_by__isnull=True, created_at__lt=old
    ).select_related("conversation__tenant")[:limit]:
        try:
            segment_rebuild(segment=segment)
            rebuilt += 1
        except Exception:
            logger.exception("rebuilding truncation segment %s failed", segment.id)
    return {"interrupted": interrupted, "queued": queued, "rebuilt": rebuilt}


def _interrupted_sweep(limit: int) -> int:
    """Runs marked as running for longer than a run may last (its hard time limit and one lock TTL)."""
    longest = timedelta(
        seconds=settings.MNEMO_COMPACTION_HARD_TIME_LIMIT + settings.MNEMO_COMPACTION_LOCK_TTL_SECONDS
    )
    stale = CompactionState.objects.filter(running_since__lt=timezone.now() - longest).select_related(
        "conversation"
    )[:limit]
    return sum(
        compaction_interrupted_record(conversation=state.conversation, trigger="catch-up", older_than=longest)
        for state in stale
    )


# --- rebuild and replay -------------------------------------------------------------------------------------


def segment_rebuild(*, segment: SummarySegment, sync: bool = False) -> SummarySegment | None:
    """Summarise a live segment's range again with the current template (from raw messages; a roll-up whose
    raw messages exceed the summariser's input is rebuilt from the segments it replaced). The old segment is
    superseded, a compact_summary message records the new one. None when the segment is no longer live."""
    conversation = segment.conversation
    cfg = compaction_config_requested(conversation)
    with compaction_lock(conversation.pk, ttl=cfg.lock_ttl):
        segment.refresh_from_db()
        if segment.superseded_by_id is not None:
            return None
        summary, built_from = _rebuild_summary(conversation, segment, cfg, sync=sync)
        new = _segment(
            conversation,
            start_seq=segment.start_seq,
            end_seq=segment.end_seq,
            level=segment.level,
            summary=summary,
            built_from=built_from,
            extra={"rebuild_of": str(segment.id)},
        )
        new.boundary_seq = segment.boundary_seq
        with transaction.atomic():
            (message,) = compaction_records_append(
                conversation=conversation,
                records=[_summary_record(new, supersedes=[str(segment.id)])],
            )
            new.summary_seq = message.seq
            new.save()
            SummarySegment.objects.filter(pk=segment.pk).update(superseded_by=new)
            _publish(
                conversation,
                "summary.updated",
                {"reason": "rebuild", "segment": segment_data(new), "supersedes": [str(segment.id)]},
            )
    return new


def _rebuild_summary(
    conversation: Conversation, segment: SummarySegment, cfg: CompactionConfig, *, sync: bool
) -> tuple[SummaryText | None, str]:
    """(the segment's new summary, what it was built from): from its raw messages (offline when they are
    more than the summariser reads and there are no segments it replaced), else from those segments."""
    raw = _raw_messages(conversation, segment.start_seq, segment.end_seq)
    raw_tokens = sum(m.token_count for m in raw)
    children = list(segment.replaces.order_by("start_seq", "level"))
    if segment.level == 0:
        target = target_tokens_for(raw_tokens, cfg)
    else:
        target = max(
            64,
            min(cfg.segment_cap, cfg.segment_max_tokens * 2, int(raw_tokens * cfg.summary_ratio)),
        )
    if children and raw_tokens > cfg.max_input_tokens:
        summary = _summarise_segments(conversation, children, target_tokens=target, cfg=cfg, sync=sync)
        return summary, SummarySegment.BuiltFrom.SEGMENTS
    rebuild_cfg = cfg if raw_tokens <= cfg.max_input_tokens else _offline(cfg)
    if not raw:
        return None, SummarySegment.BuiltFrom.RAW
    summary = _summarise_raw(
        conversation, raw, target_tokens=target, cfg=rebuild_cfg, instructions="", sync=sync
    )
    return summary, SummarySegment.BuiltFrom.RAW


def _offline(cfg: CompactionConfig) -> CompactionConfig:
    from dataclasses import replace

    return replace(cfg, llm=None)


def segments_replay(*, conversation: Conversation, cut: int | None = None) -> list[SummarySegment]:
    """Rebuild the segment rows of a conversation that has compaction records but no segments (an imported
    transcript) from its compact_summary messages, in seq order, superseding as recorded. Idempotent: a
    conversation that has segments, or was already replayed, is left alone. Returns the live segments.
    `cut`: the seq B6 resumes after, when the caller has read it already."""
    cut = boundary_last(conversation)[1] if cut is None else cut
    if cut == 0:
        return []
    if SummarySegment.objects.filter(conversation=conversation).exists():
        return segments_live(conversation=conversation)
    state = CompactionState.objects.filter(pk=conversation.pk).first()
    if state is not None and state.last_end_seq >= cut:
        return []
    replayed: dict[str, SummarySegment] = {}
    boundaries = list(
        Message.objects.filter(conversation=conversation, kind=Message.Kind.COMPACT_BOUNDARY)
        .order_by("seq")
        .values_list("seq", flat=True)
    )
    with transaction.atomic():
        for message in Message.objects.filter(
            conversation=conversation, kind=Message.Kind.COMPACT_SUMMARY
        ).order_by("seq"):
            meta = message.metadata if isinstance(message.metadata, dict) else {}
            info = meta.get("segment")
            if not isinstance(info, dict) or not _valid_replay(info):
                continue
            segment = SummarySegment(
                conversation=conversation,
                start_seq=info["startSeq"],
                end_seq=info["endSeq"],
                level=info.get("level", 0) if isinstance(info.get("level"), int) else 0,
                text=message.content,
                source=info["source"],
                built_from=str(info["builtFrom"])
                if info.get("builtFrom") in SummarySegment.BuiltFrom.values
                else "raw",
                model=str(info.get("model") or "")[:100],
                template_version=str(info.get("templateVersion") or "imported")[:32],
                facts_checked=_nat(info.get("factsChecked")),
                facts_missing=_nat(info.get("factsMissing")),
                # The boundary a summary belongs to is the last one written before it.
                boundary_seq=boundaries[max(0, bisect.bisect_left(boundaries, message.seq) - 1)]
                if boundaries
                else 0,
                summary_seq=message.seq,
                metadata={
                    "replayed_from": info.get("id"),
                    **_days(conversation, info["startSeq"], info["endSeq"]),
                },
            )
            segment.token_count = count_text(segment_prompt_text(segment), model=conversation.model)
            segment.save()
            for old in meta.get("supersedes") or []:
                target = replayed.get(old) if isinstance(old, str) else None
                if target is not None:
                    SummarySegment.objects.filter(pk=target.pk).update(superseded_by=segment)
            if isinstance(info.get("id"), str):
                replayed[info["id"]] = segment
        state, _ = CompactionState.objects.get_or_create(conversation=conversation)
        CompactionState.objects.filter(pk=conversation.pk).update(last_end_seq=max(state.last_end_seq, cut))
    return segments_live(conversation=conversation)


def _nat(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _valid_replay(info: dict[str, Any]) -> bool:
    start, end = info.get("startSeq"), info.get("endSeq")
    return (
        _nat(start) == start
        and _nat(end) == end
        and start <= end
        and info.get("source") in SummarySegment.Source.values
    )
