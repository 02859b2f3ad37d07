"""Rebuilding a live segment (resummarize, the admin's "rebuild summaries", truncation segments the
catch-up sweep turns into summaries): its range summarised again with the current template, the old segment
superseded and the new one recorded in the transcript."""

from dataclasses import replace

from django.db import transaction

from conversations.models import Conversation
from conversations.services import compaction_records_append
from summaries.conf import CompactionConfig, compaction_config_requested
from summaries.locks import compaction_lock
from summaries.models import SummarySegment
from summaries.services.compaction.plan import raw_messages
from summaries.services.compaction.records import publish, segment_data, summary_record
from summaries.services.compaction.segments import segment_build, summarise_raw, summarise_segments
from summaries.services.summarise import SummaryText, target_tokens_for


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
        new = segment_build(
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
                records=[summary_record(new, supersedes=[str(segment.id)])],
            )
            new.summary_seq = message.seq
            new.save()
            SummarySegment.objects.filter(pk=segment.pk).update(superseded_by=new)
            publish(
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
    raw = raw_messages(conversation, segment.start_seq, segment.end_seq)
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
        summary = summarise_segments(conversation, children, target_tokens=target, cfg=cfg, sync=sync)
        return summary, SummarySegment.BuiltFrom.SEGMENTS
    # More raw messages than the summariser reads and nothing to build from instead: the offline summariser.
    rebuild_cfg = cfg if raw_tokens <= cfg.max_input_tokens else replace(cfg, llm=None)
    if not raw:
        return None, SummarySegment.BuiltFrom.RAW
    summary = summarise_raw(
        conversation, raw, target_tokens=target, cfg=rebuild_cfg, instructions="", sync=sync
    )
    return summary, SummarySegment.BuiltFrom.RAW
