"""The background queue of compaction: the compact_conversation task, the queued mark it clears
(CompactionState.queued_at: duplicate triggers collapse into one queued task), what readiness waits on, and
the replay of an imported transcript's segments, queued once through providers.background.

The tasks live here, beside the mark they clear and the requests that send them, so that this package never
imports summaries.tasks (which hands them on under their registered names)."""

import logging
import uuid
from datetime import timedelta

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import Q
from django.utils import timezone

from conversations.models import Conversation
from providers.background import retry_countdown, task_queue_once, task_send_marked, task_started
from summaries.conf import compaction_config_requested
from summaries.locks import LockBusy, compaction_lock
from summaries.models import CompactionState
from summaries.services.compaction.plan import history_tokens
from summaries.services.compaction.replay import replay_pending, segments_replay
from summaries.services.compaction.run import compaction_run
from summaries.services.compaction.write import CompactionStale
from tenants.statements import FixedQuery

logger = logging.getLogger(__name__)

# A queued replay is waited for by readiness; its mark outlives any wait for a worker, and a lost run is
# replaced when it expires (the catch-up sweep queues it again).
REPLAY_MARK_SECONDS = 600


def _stale_before() -> timedelta:
    # A queued mark older than twice a run's hard limit belongs to a lost task: it is neither waited for
    # nor does it hold back a new request.
    return timedelta(seconds=settings.MNEMO_COMPACTION_HARD_TIME_LIMIT * 2)


def compaction_queued(conversation: Conversation) -> bool:
    """A compaction is queued and not stale (compaction_request would collapse another trigger into it)."""
    queued_at = _QUEUED_AT.first(conversation_id=conversation.pk)
    return queued_at is not None and queued_at >= timezone.now() - _stale_before()


# Asked by context calls whose history outgrew the window: a fixed statement (tenants.statements), the mark
# compared here rather than in SQL, so that the statement does not change with the clock.
_QUEUED_AT = FixedQuery(
    lambda conversation_id: CompactionState.objects.filter(pk=conversation_id).values_list(
        "queued_at", flat=True
    )[:1],
    conversation_id=uuid.UUID(int=0xC0DE),
)


def compaction_due(conversation: Conversation) -> bool:
    """The history since the last boundary has reached the background share of the budget the client last
    asked for (or the configured one): a compaction should run, whether or not a context call asked."""
    cfg = compaction_config_requested(conversation)
    return history_tokens(conversation) >= cfg.background * cfg.history_budget


def compaction_settled(conversation: Conversation) -> bool:
    """No compaction queued, running or due, and no replay of an imported transcript pending (readiness).
    One due and not queued is queued here (a history loaded without context calls is compacted without
    waiting for one, or for the catch-up sweep), as is a pending replay."""
    running = CompactionState.objects.filter(pk=conversation.pk, running_since__isnull=False).exists()
    if running or compaction_queued(conversation):  # a stale mark (a lost task) is not waited for
        return False
    if replay_pending(conversation):
        segments_replay_request(conversation_id=conversation.pk)
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
    for this run and the later ones (compaction_config_requested).

    The mark is the state row's queued_at, not task_queue_once's cache key: the API and the admin show it,
    the budgets are stored with it in one conditional update, and every process (the embedded worker's
    too) sees it. Sending goes through the same helper, so a broker failure releases it the same way."""
    CompactionState.objects.get_or_create(conversation=conversation)
    now = timezone.now()
    asked = {"history_budget": history_budget, "summary_budget": summary_budget}
    queued = (
        CompactionState.objects.filter(pk=conversation.pk)
        .filter(Q(queued_at__isnull=True) | Q(queued_at__lt=now - _stale_before()))
        .update(queued_at=now, **{k: v for k, v in asked.items() if v is not None})
    )
    if not queued:
        return False
    conversation_id = str(conversation.pk)
    mark = CompactionState.objects.filter(pk=conversation.pk, queued_at=now)

    def send() -> None:
        task_send_marked(compact_conversation, conversation_id, trigger, history_budget, release=release)

    def release() -> None:
        mark.update(queued_at=None)

    transaction.on_commit(send, robust=True)
    return True


def compaction_run_queued(
    *,
    conversation_id: uuid.UUID | str,
    trigger: str = "auto",
    history_budget: int | None = None,
    will_retry: bool = False,
) -> str:
    """The body of the background task. Clears the queued mark first (a trigger arriving during the run
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


@shared_task(
    name="summaries.tasks.compact_conversation",
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
    """One background compaction (compaction_request queues it); retried with backoff while another run
    holds the lock or the run timed out or lost its database."""
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
        raise self.retry(exc=exc, countdown=retry_countdown(self.request.retries)) from exc
    except (SoftTimeLimitExceeded, DatabaseError) as exc:
        if not will_retry:
            raise
        logger.warning("compaction of %s failed (%s); retrying", conversation_id, type(exc).__name__)
        raise self.retry(exc=exc, countdown=retry_countdown(self.request.retries)) from exc


# --- replay of an imported transcript ---------------------------------------------------------------------


def replay_queued_key(conversation_id: uuid.UUID | str) -> str:
    return f"mnemo:summaries:replay:queued:{conversation_id}"


def segments_replay_request(*, conversation_id: uuid.UUID | str) -> bool:
    """Queue the replay of an imported transcript's segments (once while one waits). Returns whether a run
    is queued."""
    return task_queue_once(
        segments_replay_imported,
        str(conversation_id),
        mark=replay_queued_key(conversation_id),
        mark_seconds=REPLAY_MARK_SECONDS,
    )


# Bounded like every other task, so the broker's visibility timeout (config/django/base.py) outlasts it.
@shared_task(
    name="summaries.tasks.segments_replay_imported",
    bind=True,
    acks_late=True,
    max_retries=5,
    soft_time_limit=600,
    time_limit=660,
)
def segments_replay_imported(self, conversation_id: str) -> int:
    """Make the segments of an imported transcript from its summary records, under the compaction lock (a
    compaction run that holds it replays first). Returns how many live segments it has."""
    task_started(replay_queued_key(conversation_id))
    conversation = Conversation.objects.select_related("tenant").filter(pk=conversation_id).first()
    if conversation is None:
        return 0
    try:
        with compaction_lock(conversation.pk):
            return len(segments_replay(conversation=conversation))
    except LockBusy as exc:
        if self.request.is_eager:
            return 0  # in-process: the run holding the lock replays before it compacts
        raise self.retry(exc=exc, countdown=retry_countdown(self.request.retries)) from exc
