"""Celery tasks. They take ids, import their service inside the function, hold only the retry policy, and
return quietly when the row is gone. One compaction per conversation at a time (summaries.locks);
duplicate triggers collapse before they get here (compaction_request)."""

import logging
import random

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import DatabaseError

logger = logging.getLogger(__name__)


def _backoff(retries: int) -> float:
    # 5 s, 10 s, 20 s … capped at 5 minutes, with jitter so a burst of retries does not arrive together.
    return min(300.0, 5.0 * 2**retries) * random.uniform(0.8, 1.2)  # noqa: S311


@shared_task(
    bind=True,
    acks_late=True,
    # A worker lost mid-run puts the message back: the run is idempotent by (conversation, end_seq).
    reject_on_worker_lost=True,
    max_retries=settings.MNEMO_COMPACTION_MAX_RETRIES,
    soft_time_limit=settings.MNEMO_COMPACTION_SOFT_TIME_LIMIT,
    time_limit=settings.MNEMO_COMPACTION_HARD_TIME_LIMIT,
)
def compact_conversation(
    self, conversation_id: str, trigger: str = "auto", history_budget: int | None = None
) -> str:
    from summaries.locks import LockBusy
    from summaries.services import compaction_run_queued

    will_retry = self.request.retries < self.max_retries and not self.request.is_eager
    try:
        return compaction_run_queued(
            conversation_id=conversation_id,
            trigger=trigger,
            history_budget=history_budget,
            will_retry=will_retry,
        )
    except LockBusy as exc:
        if self.request.is_eager:
            return "busy"  # in-process: the run holding the lock does the work
        raise self.retry(exc=exc, countdown=_backoff(self.request.retries)) from exc
    except (SoftTimeLimitExceeded, DatabaseError) as exc:
        if not will_retry:
            raise
        logger.warning("compaction of %s failed (%s); retrying", conversation_id, type(exc).__name__)
        raise self.retry(exc=exc, countdown=_backoff(self.request.retries)) from exc


@shared_task(acks_late=True, soft_time_limit=600, time_limit=660)
def compaction_catch_up() -> dict:
    """Beat: compaction for conversations that grew past the background threshold unnoticed."""
    from summaries.services import compaction_catch_up as catch_up

    return catch_up()


# Bounded like every other task, so the broker's visibility timeout (config/django/base.py) outlasts it: a
# rebuild that needs longer goes on in a new task from where it stopped (segments made before it started).
@shared_task(bind=True, acks_late=True, max_retries=3, soft_time_limit=600, time_limit=660)
def segments_rebuild(
    self, conversation_id: str, only_outdated: bool = False, made_before: str | None = None
) -> int:
    """Rebuild a conversation's live segments (admin action "rebuild summaries")."""
    from django.utils import timezone
    from django.utils.dateparse import parse_datetime

    from providers.background import task_send
    from summaries.locks import LockBusy
    from summaries.models import SummarySegment
    from summaries.selectors import segments_to_rebuild
    from summaries.services import segment_rebuild

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
        raise self.retry(exc=exc, countdown=_backoff(self.request.retries)) from exc
    except SoftTimeLimitExceeded:
        logger.warning("rebuild of %s goes on in a new task after %d segments", conversation_id, count)
        task_send(segments_rebuild, conversation_id, only_outdated, made_before)
    return count
