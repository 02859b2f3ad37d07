"""Celery tasks of the summaries app, under the names the broker and the beat schedule know. They take ids,
hold only their retry policy and return quietly when the row is gone. One compaction per conversation at a
time (summaries.locks); duplicate triggers collapse before they get here (compaction_request). The compaction
and replay tasks live with the queue that sends them (summaries.services.compaction.queue)."""

import logging

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from providers.background import retry_countdown, task_send
from summaries.locks import LockBusy
from summaries.models import SummarySegment
from summaries.selectors import segments_to_rebuild
from summaries.services.compaction import compaction_catch_up as catch_up
from summaries.services.compaction import segment_rebuild
from summaries.services.compaction.queue import compact_conversation, segments_replay_imported

__all__ = ["compact_conversation", "compaction_catch_up", "segments_rebuild", "segments_replay_imported"]

logger = logging.getLogger(__name__)


@shared_task(acks_late=True, soft_time_limit=600, time_limit=660)
def compaction_catch_up() -> dict:
    """Beat: compaction for conversations that grew past the background threshold unnoticed."""
    return catch_up()


# Bounded like every other task, so the broker's visibility timeout (config/django/base.py) outlasts it: a
# rebuild that needs longer goes on in a new task from where it stopped (segments made before it started).
@shared_task(bind=True, acks_late=True, max_retries=3, soft_time_limit=600, time_limit=660)
def segments_rebuild(
    self, conversation_id: str, only_outdated: bool = False, made_before: str | None = None
) -> int:
    """Rebuild a conversation's live segments (admin action "rebuild summaries")."""
    if not SummarySegment.objects.filter(conversation_id=conversation_id).exists():
        return 0
    made_before = made_before or timezone.now().isoformat()
    segments = segments_to_rebuild(conversation_id=conversation_id, only_outdated=only_outdated)
    count = 0
    try:
        for segment in segments.filter(created_at__lt=parse_datetime(made_before)):
            count += segment_rebuild(segment=segment) is not None
    except LockBusy as exc:
        if self.request.is_eager:
            return count
        raise self.retry(exc=exc, countdown=retry_countdown(self.request.retries)) from exc
    except SoftTimeLimitExceeded:
        logger.warning("rebuild of %s goes on in a new task after %d segments", conversation_id, count)
        task_send(segments_rebuild, conversation_id, only_outdated, made_before)
    return count
