"""A failed or interrupted compaction is recorded where the API and the admin show it, and the catch-up sweep
retries it; the compaction lock is short-lived and renewed by its holder, so a dead holder frees it soon.
(tests/faults/ kills a real worker mid-run; these run in `make test`.)"""

import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from conversations.models import Conversation, Message
from summaries import tasks
from summaries.conf import compaction_config
from summaries.locks import LockBusy, compaction_lock
from summaries.models import CompactionState
from summaries.services import compaction_catch_up, compaction_run
from tests.summaries.helpers import budgets, history

pytestmark = pytest.mark.django_db


def boundaries(conversation) -> int:
    return Message.objects.filter(conversation=conversation, kind="compact_boundary").count()


def summaries_of(actor, conversation):
    return actor.client.get(f"/api/v1/conversations/{conversation.pk}/summaries")


def test_a_run_left_marked_by_a_killed_worker_is_recorded_as_failed_and_redone(owner, outsider, conversation):
    budgets(owner.tenant, history=1000)
    history(conversation, 20)
    started = timezone.now() - timedelta(seconds=5)
    # What a worker killed mid-run leaves behind: the committed running mark, the lock gone with its TTL.
    CompactionState.objects.create(conversation=conversation, running_since=started)
    assert summaries_of(owner, conversation).json()["compaction"]["status"] == "running"

    assert tasks.compact_conversation.delay(str(conversation.pk), "auto").get() == "compacted"

    state = CompactionState.objects.get(pk=conversation.pk)
    assert (state.failures, state.compactions, state.running_since) == (1, 1, None)
    assert state.last_failed_at is not None and state.last_error == ""  # recovered: the error is cleared
    assert boundaries(conversation) == 1
    shown = summaries_of(owner, conversation).json()["compaction"]
    assert shown["status"] == "idle" and shown["failures"] == 1 and shown["last_failed_at"]
    assert summaries_of(outsider, conversation).status_code == 404


def test_a_failed_run_shows_in_the_api_and_the_admin_until_a_run_succeeds(
    client, member, owner, conversation, monkeypatch
):
    from summaries.services.compaction import run as compaction_run_module

    history(conversation, 20)

    def broken(*args, **kwargs):
        raise RuntimeError("summariser exploded")

    monkeypatch.setattr(compaction_run_module, "_run", broken)
    with pytest.raises(RuntimeError):
        compaction_run(conversation=conversation, trigger="manual", sync=False)
    shown = summaries_of(owner, conversation).json()["compaction"]
    assert shown["status"] == "failed"
    assert shown["last_error"] == "RuntimeError: summariser exploded"
    assert shown["failures"] == 1 and shown["running_since"] is None

    client.force_login(member.user)
    page = client.get(reverse("admin:conversations_conversation_change", args=[conversation.pk]))
    assert page.status_code == 200
    assert "failed · 0 compaction(s), 1 failure(s)" in page.content.decode()
    assert "RuntimeError: summariser exploded" in page.content.decode()

    monkeypatch.undo()
    assert compaction_run(conversation=conversation, trigger="manual") is not None
    assert summaries_of(owner, conversation).json()["compaction"]["status"] == "idle"


def test_the_sweep_records_a_run_that_outlived_any_deadline_and_queues_it_again(
    owner, conversation, django_capture_on_commit_callbacks
):
    budgets(owner.tenant, history=1000)
    history(conversation, 20)
    longest = settings.MNEMO_COMPACTION_HARD_TIME_LIMIT + settings.MNEMO_COMPACTION_LOCK_TTL_SECONDS
    CompactionState.objects.create(
        conversation=conversation, running_since=timezone.now() - timedelta(seconds=longest + 5)
    )
    with django_capture_on_commit_callbacks(execute=True):
        result = compaction_catch_up()
    assert result["interrupted"] == 1 and result["queued"] == 1
    state = CompactionState.objects.get(pk=conversation.pk)
    assert state.failures == 1 and state.compactions == 1 and state.running_since is None
    assert boundaries(conversation) == 1


def test_the_sweep_leaves_a_run_younger_than_its_deadline_alone(owner, conversation):
    budgets(owner.tenant, history=1000)
    history(conversation, 20)
    CompactionState.objects.create(conversation=conversation, running_since=timezone.now())
    assert compaction_catch_up()["interrupted"] == 0
    assert CompactionState.objects.get(pk=conversation.pk).failures == 0


def test_the_sweep_retries_a_failed_compaction_of_a_conversation_quiet_for_long(
    owner, conversation, django_capture_on_commit_callbacks
):
    budgets(owner.tenant, history=1000)
    history(conversation, 20)
    long_ago = timezone.now() - timedelta(seconds=settings.MNEMO_COMPACTION_CATCHUP_LOOKBACK_SECONDS + 60)
    Conversation.objects.filter(pk=conversation.pk).update(updated_at=long_ago)
    CompactionState.objects.create(conversation=conversation, last_error="OperationalError: gone", failures=3)
    with django_capture_on_commit_callbacks(execute=True):
        assert compaction_catch_up()["queued"] == 1
    assert boundaries(conversation) == 1
    assert CompactionState.objects.get(pk=conversation.pk).last_error == ""


def test_the_lock_lives_a_short_ttl_shorter_than_the_retries_that_wait_for_it(conversation):
    ttl = compaction_config(conversation).lock_ttl
    assert ttl == settings.MNEMO_COMPACTION_LOCK_TTL_SECONDS
    # A retried task reaches the lock of a dead holder after it expired: backoff 5 + 10 + 20 + … seconds.
    waited = sum(min(300.0, 5.0 * 2**n) * 0.8 for n in range(settings.MNEMO_COMPACTION_MAX_RETRIES))
    assert ttl < waited
    assert ttl < settings.MNEMO_COMPACTION_SOFT_TIME_LIMIT  # the heartbeat, not the TTL, covers a long run


def test_a_dead_holders_lease_is_taken_over_once_it_expires(conversation, settings):
    settings.REDIS_URL = None  # the database lease (no Redis, or Redis down)
    CompactionState.objects.create(
        conversation=conversation, lease_owner="dead", lease_until=timezone.now() + timedelta(seconds=30)
    )
    with pytest.raises(LockBusy), compaction_lock(conversation.pk, ttl=5):
        pass
    CompactionState.objects.filter(pk=conversation.pk).update(
        lease_until=timezone.now() - timedelta(seconds=1)
    )
    with compaction_lock(conversation.pk, ttl=5):
        assert CompactionState.objects.get(pk=conversation.pk).lease_owner not in ("", "dead")
    assert CompactionState.objects.get(pk=conversation.pk).lease_owner == ""


@pytest.mark.django_db(transaction=True)
def test_the_holder_renews_its_lease_while_it_runs(conversation, settings):
    settings.REDIS_URL = None
    CompactionState.objects.create(conversation=conversation)
    renewed = threading.Event()
    with compaction_lock(conversation.pk, ttl=3):
        first = CompactionState.objects.get(pk=conversation.pk).lease_until
        for _ in range(50):  # the heartbeat runs every second (a third of the TTL); wait up to 5 s
            if CompactionState.objects.get(pk=conversation.pk).lease_until > first:
                renewed.set()
                break
            threading.Event().wait(0.1)
    assert renewed.is_set(), "the lease was not renewed while its holder ran"
    assert CompactionState.objects.get(pk=conversation.pk).lease_until is None


@pytest.mark.redis
def test_the_holder_keeps_its_redis_lock_past_the_ttl_while_it_runs(conversation, settings):
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL")
    import redis

    from summaries.locks import lock_key

    client = redis.Redis.from_url(settings.REDIS_URL)
    with compaction_lock(conversation.pk, ttl=3):
        threading.Event().wait(4.5)  # longer than the TTL: only the heartbeat keeps it
        assert client.exists(lock_key(conversation.pk)), "the lock expired under its running holder"
        with pytest.raises(LockBusy), compaction_lock(conversation.pk, ttl=3):
            pass
    assert not client.exists(lock_key(conversation.pk))


def test_with_redis_down_the_lock_falls_back_to_the_database_lease(conversation, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    with compaction_lock(conversation.pk, ttl=5):
        assert CompactionState.objects.get(pk=conversation.pk).lease_owner != ""
        with pytest.raises(LockBusy), compaction_lock(conversation.pk, ttl=5):
            pass
    assert CompactionState.objects.get(pk=conversation.pk).lease_owner == ""
