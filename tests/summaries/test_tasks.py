"""The Celery side, in-process (eager): duplicate triggers collapse into one queued task, the task clears its
flag and compacts only above the background share, a busy lock does not fail an eager run, the periodic
catch-up finds conversations that grew unnoticed, and the task carries its retry and time-limit policy."""

import pytest
from django.conf import settings

from conversations.models import Message
from providers.background import retry_countdown
from summaries import tasks
from summaries.locks import compaction_lock, lock_key
from summaries.models import CompactionState
from summaries.services import compaction_catch_up, compaction_request
from tests.summaries.helpers import budgets, history

pytestmark = pytest.mark.django_db


def boundaries(conversation) -> int:
    return Message.objects.filter(conversation=conversation, kind="compact_boundary").count()


def test_duplicate_triggers_collapse_into_one_queued_task(conversation, django_capture_on_commit_callbacks):
    history(conversation, 20)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert compaction_request(conversation=conversation, trigger="manual") is True
        assert compaction_request(conversation=conversation, trigger="manual") is False
        assert compaction_request(conversation=conversation, trigger="auto") is False
    assert len(callbacks) == 1
    assert CompactionState.objects.get(pk=conversation.pk).queued_at is not None


def test_the_queued_task_runs_on_commit_and_clears_its_flag(conversation, django_capture_on_commit_callbacks):
    history(conversation, 20)
    with django_capture_on_commit_callbacks(execute=True):
        compaction_request(conversation=conversation, trigger="manual")
    assert boundaries(conversation) == 1
    assert CompactionState.objects.get(pk=conversation.pk).queued_at is None
    # The next trigger queues again.
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert compaction_request(conversation=conversation, trigger="manual") is True
    assert len(callbacks) == 1


def test_an_automatic_run_below_the_background_share_does_nothing(owner, conversation):
    budgets(owner.tenant, history=100_000)
    history(conversation, 20)
    assert tasks.compact_conversation.delay(str(conversation.pk), "auto").get() == "not_needed"
    assert boundaries(conversation) == 0
    assert tasks.compact_conversation.delay(str(conversation.pk), "manual").get() == "compacted"
    assert boundaries(conversation) == 1


def test_a_busy_lock_does_not_fail_an_eager_run(conversation):
    history(conversation, 20)
    with compaction_lock(conversation.pk, ttl=60):
        assert tasks.compact_conversation.delay(str(conversation.pk), "manual").get() == "busy"
    assert boundaries(conversation) == 0


def test_a_deleted_conversation_is_skipped_quietly(conversation):
    conversation_id = str(conversation.pk)
    conversation.delete()
    assert tasks.compact_conversation.delay(conversation_id, "manual").get() == "gone"


def test_catch_up_queues_conversations_that_grew_past_the_background_share(
    owner, conversation, django_capture_on_commit_callbacks
):
    from conversations.services import conversation_create

    quiet = conversation_create(tenant=owner.tenant, title="quiet")
    budgets(owner.tenant, history=1000)
    history(conversation, 20)  # well past 600 tokens
    history(quiet, 1)
    with django_capture_on_commit_callbacks(execute=True):
        result = compaction_catch_up()
    assert result["queued"] == 1
    assert boundaries(conversation) == 1
    assert boundaries(quiet) == 0


def test_the_task_policy_and_the_beat_schedule():
    task = tasks.compact_conversation
    assert task.acks_late is True
    assert task.reject_on_worker_lost is True
    assert task.max_retries == settings.MNEMO_COMPACTION_MAX_RETRIES
    assert (task.soft_time_limit, task.time_limit) == (
        settings.MNEMO_COMPACTION_SOFT_TIME_LIMIT,
        settings.MNEMO_COMPACTION_HARD_TIME_LIMIT,
    )
    entry = settings.CELERY_BEAT_SCHEDULE["summaries-compaction-catch-up"]
    assert entry["task"] == "summaries.tasks.compaction_catch_up"
    assert tasks.compaction_catch_up.name == entry["task"]
    assert 4 <= retry_countdown(0) <= 6 and retry_countdown(10) <= 360


@pytest.mark.redis
def test_with_redis_the_lock_lives_in_redis(conversation):
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL")
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    with compaction_lock(conversation.pk, ttl=30):
        assert client.exists(lock_key(conversation.pk))
        assert 0 < client.ttl(lock_key(conversation.pk)) <= 30
    assert not client.exists(lock_key(conversation.pk))
    assert not CompactionState.objects.filter(pk=conversation.pk).exists()  # no database lease was taken
