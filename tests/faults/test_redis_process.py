"""Redis stopped and started again under a running service (a real redis-server on a spare port): API calls
are served from the database meanwhile and the context response says what degraded; a real Celery worker
stays up through the outage and consumes again once Redis is back."""

import json

import pytest
import redis

from conversations.models import Message
from summaries.tasks import compact_conversation
from tests.faults.conftest import wait_for
from tests.summaries.helpers import budgets, history

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def context(actor, conversation, text: str = "what next?"):
    return actor.client.post(
        f"/api/v1/conversations/{conversation.pk}/context", {"user_message": text}, format="json"
    )


def queued(url: str) -> list[str]:
    """Names of the tasks waiting in the broker's default queue."""
    raw = redis.Redis.from_url(url).lrange("celery", 0, -1)
    return [json.loads(m)["headers"]["task"] for m in raw]


def service_codes(response) -> set[str]:
    return {d["code"] for d in response.json()["degradations"] if d["stage"] == "services"}


def test_api_calls_succeed_while_redis_is_stopped_and_say_so(owner, outsider, conversation, distributed):
    budgets(owner.tenant, history=1000)
    history(conversation, 20)  # past the background share: every context call queues a compaction
    up = context(owner, conversation)
    assert up.status_code == 200 and service_codes(up) == set()
    assert "summaries.tasks.compact_conversation" in queued(distributed.url)  # through the real broker

    distributed.stop()
    assert owner.client.get("/api/v1/conversations").status_code == 200
    appended = owner.client.post(
        f"/api/v1/conversations/{conversation.pk}/messages",
        {"role": "user", "content": "written while Redis is down"},
        format="json",
    )
    assert appended.status_code == 201, appended.content
    from summaries.models import CompactionState

    CompactionState.objects.filter(pk=conversation.pk).update(queued_at=None)  # the next call queues again
    down = context(owner, conversation)
    assert down.status_code == 200, down.content
    assert {"cache_unavailable", "queue_unavailable"} <= service_codes(down)
    assert outsider.client.get(f"/api/v1/conversations/{conversation.pk}").status_code == 404
    assert Message.objects.filter(conversation=conversation, content="written while Redis is down").exists()

    distributed.start()  # empty: it was started without persistence
    CompactionState.objects.filter(pk=conversation.pk).update(queued_at=None)
    again = context(owner, conversation)
    assert again.status_code == 200 and service_codes(again) == set()
    assert "summaries.tasks.compact_conversation" in queued(distributed.url)  # queued again, nothing lost


@pytest.mark.postgres
def test_a_worker_rides_out_redis_down_and_the_sweep_loses_nothing(owner, distributed, workers):
    from conversations.services import conversation_create
    from summaries.tasks import compaction_catch_up

    budgets(owner.tenant, history=1000)
    before, during = (conversation_create(tenant=owner.tenant, title=t) for t in ("before", "during"))
    history(before, 20)
    worker = workers()
    compact_conversation.apply_async((str(before.pk), "manual"))
    wait_for(lambda: compacted(before), timeout=30, what="the worker compacting before the outage")

    distributed.stop()
    wait_for(
        lambda: "Connection to broker lost" in worker.output() or not worker.alive(),
        timeout=20,
        what="the worker noticing Redis is gone",
    )
    # Meanwhile a conversation grows past its compaction threshold through the API; its compaction cannot
    # be queued (the context call says so) and Redis comes back empty: only the sweep can find it.
    for n in range(20):
        for role in ("user", "assistant"):
            response = owner.client.post(
                f"/api/v1/conversations/{during.pk}/messages",
                {"role": role, "content": f"Message {n} while Redis is down, about port {8000 + n}."},
                format="json",
            )
            assert response.status_code == 201, response.content
    down = context(owner, during)
    assert down.status_code == 200 and "queue_unavailable" in service_codes(down)
    assert worker.alive(), worker.output()[-3000:]

    distributed.start()
    # Beat's next run of the catch-up sweep, consumed by the reconnected worker.
    wait_for(lambda: _send(compaction_catch_up), timeout=10, what="queueing with Redis back")
    wait_for(lambda: compacted(during) or not worker.alive(), timeout=30, what="the sweep's compaction")
    assert worker.alive() and compacted(during), worker.output()[-3000:]


def compacted(conversation) -> bool:
    return Message.objects.filter(conversation=conversation, kind="compact_boundary").exists()


def _send(task, *args) -> bool:
    try:
        task.apply_async(args)
    except Exception:
        return False
    return True
