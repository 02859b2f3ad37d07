"""A compaction that finds its conversation's lock held is retried through the broker, after its countdown,
by a real `celery worker` (on a spare redis-server and the PostgreSQL test database), and compacts once the
lock is free. Before: the worker ran with the test settings' eager tasks, so the retry ran at once inside the
worker, found the lock still held, and was lost (the killed-worker test failed whenever the redelivery came
before the dead worker's lock expired)."""

import pytest

from summaries.locks import compaction_lock
from summaries.models import CompactionState
from summaries.tasks import compact_conversation
from tests.faults.conftest import wait_for
from tests.llm_server import llm_server  # noqa: F401
from tests.summaries.helpers import history

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_compaction_that_finds_the_lock_held_runs_again_once_it_is_free(owner, workers, llm_server):  # noqa: F811
    from conversations.services import conversation_create

    conversation = conversation_create(tenant=owner.tenant, title="no end user: no memory agent task")
    history(conversation, 20)
    llm_server.default = "good"
    worker = workers(LLM_BASE_URL=llm_server.base_url, LLM_API_KEY="k", LLM_MODEL="test-model")

    with compaction_lock(conversation.pk):  # another run holds it
        compact_conversation.apply_async((str(conversation.pk), "manual"))
        wait_for(lambda: "LockBusy" in worker.output(), timeout=30, what="the worker finding the lock held")

    def compacted() -> bool:
        state = CompactionState.objects.filter(pk=conversation.pk).first()  # the run makes the row
        return bool(state and state.compactions == 1 and state.running_since is None)

    wait_for(
        lambda: compacted() or not worker.alive(),
        timeout=30,
        what="the retried compaction",
        detail=lambda: worker.output()[-4000:],
    )
    assert compacted(), worker.output()[-3000:]
