"""Making segments (unsaved): one from a summary of a range's raw messages, a truncation segment when no
summary could be made, and the roll-ups of the oldest live segments while B4 is over its budget (from their
raw messages when those fit the summariser's input, otherwise from the segments, recorded either way)."""

from typing import Any

from django.db.models import Max, Min

from conversations.models import Conversation, Message
from providers.summariser import SourceMessage
from providers.tokens import count_text
from summaries.conf import CompactionConfig
from summaries.models import SummarySegment
from summaries.prompts import TEMPLATE_VERSION
from summaries.selectors import segment_prompt_text
from summaries.services.compaction.plan import range_tokens, raw_messages
from summaries.services.summarise import SummaryText, named_attachments, source_messages, summary_make

TRUNCATION_TEXT = (
    "(No summary could be made of messages {start}–{end}; they are left out of the prompt and remain in "
    "the transcript.)"
)


def segment_build(
    conversation: Conversation,
    *,
    start_seq: int,
    end_seq: int,
    level: int,
    summary: SummaryText | None,
    built_from: str,
    extra: dict[str, Any] | None = None,
) -> SummarySegment:
    """An unsaved segment of `summary` (a truncation segment when it is None), its tokens counted as the
    prompt shows it."""
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
    metadata.update(segment_days(conversation, start_seq, end_seq))
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


def segment_days(conversation: Conversation, start_seq: int, end_seq: int) -> dict[str, str]:
    """The first and last day of the messages a segment covers (B4 says which dates it holds)."""
    span = Message.objects.filter(
        conversation=conversation, seq__gte=start_seq, seq__lte=end_seq, kind=Message.Kind.MESSAGE
    ).aggregate(first=Min("created_at"), last=Max("created_at"))
    if span["first"] is None:
        return {}
    return {"first_day": span["first"].date().isoformat(), "last_day": span["last"].date().isoformat()}


def summarise_raw(
    conversation: Conversation,
    messages: list[Message],
    *,
    target_tokens: int,
    cfg: CompactionConfig,
    instructions: str,
    sync: bool,
) -> SummaryText:
    """One summary of raw messages (their text is also what the fact check reads)."""
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


def summarise_segments(
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


def rollups_make(
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
        rollup = segment_build(
            conversation,
            start_seq=group[0].start_seq,
            end_seq=group[-1].end_seq,
            level=max(s.level for s in group) + 1,
            summary=_rollup_summary(conversation, group, built_from, target=target, cfg=cfg, sync=sync),
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


def _rollup_summary(
    conversation: Conversation,
    group: list[SummarySegment],
    built_from: str,
    *,
    target: int,
    cfg: CompactionConfig,
    sync: bool,
) -> SummaryText:
    if built_from == SummarySegment.BuiltFrom.RAW:
        start, end = group[0].start_seq, group[-1].end_seq
        return summarise_raw(
            conversation,
            raw_messages(conversation, start, end),
            target_tokens=target,
            cfg=cfg,
            instructions="",
            sync=sync,
        )
    return summarise_segments(conversation, group, target_tokens=target, cfg=cfg, sync=sync)


def _rollup_group(
    conversation: Conversation, live: list[SummarySegment], cfg: CompactionConfig
) -> tuple[list[SummarySegment], str, int]:
    """(the oldest live segments to roll up into one, what to build it from, their raw messages' tokens):
    from raw messages, as many segments as the summariser's input and half of B4's budget allow (at least
    two); from the two oldest segments' texts when even their raw messages are too many."""
    group = live[:2]
    raw_tokens = range_tokens(conversation, group[0].start_seq, group[-1].end_seq)
    if raw_tokens > cfg.max_input_tokens:
        return group, SummarySegment.BuiltFrom.SEGMENTS, raw_tokens
    for candidate in live[2:]:
        more = range_tokens(conversation, group[0].start_seq, candidate.end_seq)
        if more > cfg.max_input_tokens or sum(s.token_count for s in group) > cfg.summary_budget // 2:
            break
        group.append(candidate)
        raw_tokens = more
    return group, SummarySegment.BuiltFrom.RAW, raw_tokens
