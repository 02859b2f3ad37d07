"""Replay after a transcript import: an imported conversation carries its compaction records (boundaries and
compact_summary messages) but no segment rows; they are made again from the summary records, superseding
as recorded."""

import bisect
from typing import Any

from django.db import transaction

from conversations.models import Conversation, Message
from providers.tokens import count_text
from summaries.models import CompactionState, SummarySegment
from summaries.selectors import boundary_last, segment_prompt_text, segments_live
from summaries.services.compaction.segments import segment_days


def replay_pending(conversation: Conversation, *, cut: int | None = None) -> bool:
    """The conversation has compaction records, no segments, and was not replayed yet (an imported
    transcript whose replay has not run). `cut`: the seq B6 resumes after, when the caller has read it."""
    cut = boundary_last(conversation)[1] if cut is None else cut
    if cut == 0 or SummarySegment.objects.filter(conversation=conversation).exists():
        return False
    return not CompactionState.objects.filter(pk=conversation.pk, last_end_seq__gte=cut).exists()


def segments_replay(*, conversation: Conversation, cut: int | None = None) -> list[SummarySegment]:
    """Make the segment rows of a conversation that has compaction records but no segments (an imported
    transcript) from its compact_summary messages, in seq order, superseding as recorded. Idempotent: a
    conversation that has segments, or was already replayed, is left alone. Returns the live segments.
    `cut`: the seq B6 resumes after, when the caller has read it already."""
    cut = boundary_last(conversation)[1] if cut is None else cut
    if cut == 0:
        return []
    if not replay_pending(conversation, cut=cut):
        return segments_live(conversation=conversation)
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
            segment = _segment_of(conversation, message, info, boundaries)
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


def _segment_of(
    conversation: Conversation, message: Message, info: dict[str, Any], boundaries: list[int]
) -> SummarySegment:
    """The unsaved segment a compact_summary message records (`info`: its metadata's segment)."""
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
        boundary_seq=boundaries[max(0, bisect.bisect_left(boundaries, message.seq) - 1)] if boundaries else 0,
        summary_seq=message.seq,
        metadata={
            "replayed_from": info.get("id"),
            **segment_days(conversation, info["startSeq"], info["endSeq"]),
        },
    )
    segment.token_count = count_text(segment_prompt_text(segment), model=conversation.model)
    return segment


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
