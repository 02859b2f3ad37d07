"""The catch-up sweep (beat), the path that loses nothing: runs whose worker died are recorded, compaction is
queued where it is due without a queued task, replays are queued for imported transcripts that have none
yet, and truncation segments are rebuilt into summaries."""

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from conversations.models import Conversation, Message
from summaries.models import CompactionState, SummarySegment
from summaries.services.compaction.failures import compaction_interrupted_record
from summaries.services.compaction.queue import compaction_due, compaction_request, segments_replay_request
from summaries.services.compaction.rebuild import segment_rebuild
from summaries.services.compaction.replay import replay_pending

logger = logging.getLogger(__name__)

# A truncation segment younger than this may be one a run is still writing around: left for the next sweep.
TRUNCATION_REBUILD_AFTER = timedelta(minutes=5)


def compaction_catch_up(*, limit: int | None = None) -> dict[str, int]:
    """Periodic (beat): record runs whose worker died, then queue compaction for recently active
    conversations and those whose last run failed, when their B6 reached the background threshold without a
    queued task (the broker was down, the task was lost or gave up); queue the replay of imported
    transcripts whose segments were never made; and rebuild truncation segments."""
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
    return {
        "interrupted": interrupted,
        "queued": queued,
        "replays": _replay_sweep(limit),
        "rebuilt": _truncation_sweep(limit),
    }


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


def _replay_sweep(limit: int) -> int:
    """Imported transcripts with compaction records whose segments were never made (imported before the
    import queued their replay, or the broker did not take it): their replay is queued."""
    boundaries = Message.objects.filter(conversation=OuterRef("pk"), kind=Message.Kind.COMPACT_BOUNDARY)
    segments = SummarySegment.objects.filter(conversation=OuterRef("pk"))
    replayed = CompactionState.objects.filter(conversation=OuterRef("pk"), last_end_seq__gt=0)
    candidates = (
        Conversation.objects.filter(archived_at__isnull=True)
        .filter(Exists(boundaries))
        .exclude(Exists(segments))
        .exclude(Exists(replayed))
        .order_by("-updated_at")[:limit]
    )
    return sum(
        segments_replay_request(conversation_id=conversation.pk)
        for conversation in candidates
        if replay_pending(conversation)
    )


def _truncation_sweep(limit: int) -> int:
    rebuilt = 0
    old = timezone.now() - TRUNCATION_REBUILD_AFTER
    for segment in SummarySegment.objects.filter(
        source=SummarySegment.Source.TRUNCATION, superseded_by__isnull=True, created_at__lt=old
    ).select_related("conversation__tenant")[:limit]:
        try:
            segment_rebuild(segment=segment)
            rebuilt += 1
        except Exception:
            logger.exception("rebuilding truncation segment %s failed", segment.id)
    return rebuilt
