"""The record of a compaction that failed, or whose worker died mid-run: counted on the conversation's
state (shown by the API and the admin until a run succeeds) and published as compaction.failed."""

import logging
from datetime import timedelta

from django.db.models import F
from django.utils import timezone

from conversations.models import Conversation
from summaries.models import CompactionState
from summaries.services.compaction.records import publish

logger = logging.getLogger(__name__)


class CompactionInterrupted(Exception):
    """A compaction run started and never finished: its worker was killed or lost."""


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
    publish(
        conversation,
        "compaction.failed",
        {
            "trigger": trigger,
            "error": type(exc).__name__,
            "message": str(exc)[:500],
            "will_retry": will_retry,
        },
    )


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
