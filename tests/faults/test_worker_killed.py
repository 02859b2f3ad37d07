"""A worker killed with SIGKILL mid-compaction (a real `celery worker` on a spare redis-server and the
PostgreSQL test database): its message is handed out again once the visibility timeout passes, the lock it
held expires with its heartbeat, and the next worker records the interrupted run as a failure and does the
compaction. Before: the lock outlived every retry (300 s), redelivery waited an hour, nothing was recorded."""

import pytest

from conversations.models import Message
from summaries.models import CompactionState
from summaries.tasks import compact_conversation
from tests.faults.conftest import wait_for
from tests.llm_server import llm_server  # noqa: F401
from tests.summaries.helpers import history

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_compaction_killed_mid_run_is_redelivered_recorded_and_done(owner, workers, llm_server):  # noqa: F811
    from conversations.services import conversation_create

    conversation = conversation_create(tenant=owner.tenant, title="no end user: no memory agent task")
    history(conversation, 20)
    llm_server.default, llm_server.slow_seconds = "slow", 120  # the summary call hangs: the run is mid-way
    env = {
        "LLM_BASE_URL": llm_server.base_url,
        "LLM_API_KEY": "k",
        "LLM_MODEL": "test-model",
        "LLM_TIMEOUT_SECONDS": "120",
        "LLM_MAX_RETRIES": "0",
        # Short enough for a bounded test; production keeps 30 s and 2000 s (config/django/base.py).
        "MNEMO_COMPACTION_LOCK_TTL_SECONDS": "3",
        "MNEMO_CELERY_VISIBILITY_TIMEOUT": "5",
    }
    first = workers(**env)
    compact_conversation.apply_async((str(conversation.pk), "manual"))

    def mid_run() -> bool:
        state = CompactionState.objects.filter(pk=conversation.pk).first()
        return bool(state and state.running_since and llm_server.requests)

    wait_for(mid_run, timeout=30, what="the first worker summarising")
    first.kill()
    assert not Message.objects.filter(conversation=conversation, kind="compact_boundary").exists()

    llm_server.default = "good"
    second = workers(**env)

    def compacted() -> bool:
        state = CompactionState.objects.get(pk=conversation.pk)
        return state.compactions == 1 and state.running_since is None  # written, and the run has ended

    def logs() -> str:
        state = CompactionState.objects.filter(pk=conversation.pk).values().first()
        workers_logs = f"first worker:\n{first.output()[-3000:]}\nsecond worker:\n{second.output()[-6000:]}"
        return f"state: {state}\n{workers_logs}"

    wait_for(
        lambda: compacted() or not second.alive(), timeout=30, what="the redelivered compaction", detail=logs
    )
    assert compacted(), second.output()[-3000:]

    state = CompactionState.objects.get(pk=conversation.pk)
    assert state.compactions == 1 and state.running_since is None
    assert state.failures == 1 and state.last_failed_at is not None  # the killed run, recorded
    assert state.last_error == ""  # and recovered
    assert Message.objects.filter(conversation=conversation, kind="compact_boundary").count() == 1

    def shown() -> dict:
        return owner.client.get(f"/api/v1/conversations/{conversation.pk}/summaries").json()["compaction"]

    # At this test's 5 s visibility timeout the broker may hand the message out once more while the run is
    # still unacknowledged: that delivery finds nothing to compact, and the API says "running" while it looks.
    wait_for(lambda: shown()["status"] == "idle", timeout=30, what="the compaction shown idle", detail=logs)
    final = shown()
    assert final["compactions"] == 1 and final["failures"] == 1 and final["last_failed_at"]
    assert "interrupted" in second.output() or "did not finish" in second.output()
