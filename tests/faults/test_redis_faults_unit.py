"""Redis faults without Redis (these run in `make test`): a cache that does not answer is a miss, the broker
refusing a task is logged and reported, never a request error, and the periodic sweeps find what was never
queued. tests/faults/test_redis_process.py stops and restarts a real redis-server."""

import pytest
from django.core.cache import caches
from kombu.exceptions import OperationalError

from conversations import embedding
from conversations.models import MessageVector
from conversations.tasks import message_vectors_request, message_vectors_sweep
from providers import background, embeddings
from summaries.models import CompactionState
from summaries.services import compaction_request
from tests.summaries.helpers import append, budgets, history

pytestmark = pytest.mark.django_db

# Nothing listens on port 1: every Redis call is refused, as when the server is stopped.
DEAD_REDIS = "redis://127.0.0.1:1/0"


@pytest.fixture
def cache_down(settings):
    settings.CACHES = {
        "default": {"BACKEND": "providers.redis_cache.RedisCache", "LOCATION": DEAD_REDIS, "KEY_PREFIX": "t"}
    }
    yield caches["default"]


class Broker:
    """Task.apply_async as seen by the sender: refused as kombu refuses it when Redis is stopped, or (up)
    delivered, the task run at once as a worker would."""

    def __init__(self) -> None:
        self.up = False
        self.refused: list[str] = []

    def apply_async(self, task, args=(), kwargs=None, **options):
        if not self.up:
            self.refused.append(task.name)
            raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        return task.apply(args, kwargs)


@pytest.fixture
def broker_down(settings, monkeypatch):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.MNEMO_EAGER_TASKS_IN_THREAD = False
    monkeypatch.setattr(background, "_broker_down_until", 0.0)
    broker = Broker()
    monkeypatch.setattr(
        "celery.app.task.Task.apply_async",
        lambda task, *args, **kwargs: broker.apply_async(task, *args, **kwargs),
    )
    return broker


def test_a_cache_that_does_not_answer_is_a_miss_not_an_error(cache_down):
    assert cache_down.get("k") is None
    assert cache_down.get("k", "default") == "default"
    assert not cache_down.add("k", 1)
    cache_down.set("k", 1)
    cache_down.delete("k")


def test_api_calls_are_served_from_the_database_and_the_context_says_so(
    owner, outsider, conversation, cache_down
):
    assert owner.client.get("/api/v1/conversations").status_code == 200
    body = owner.client.post(
        f"/api/v1/conversations/{conversation.pk}/messages", {"role": "user", "content": "hi"}, format="json"
    )
    assert body.status_code == 201, body.content
    response = owner.client.post(
        f"/api/v1/conversations/{conversation.pk}/context", {"user_message": "and now?"}, format="json"
    )
    assert response.status_code == 200, response.content
    codes = {(d["stage"], d["code"]) for d in response.json()["degradations"]}
    assert ("services", "cache_unavailable") in codes
    # The cache is not a door: a wrong key and another tenant's conversation are still refused.
    assert outsider.client.get(f"/api/v1/conversations/{conversation.pk}").status_code == 404
    owner.client.credentials(HTTP_AUTHORIZATION="Bearer mnemo_nope_nope")
    assert owner.client.get("/api/v1/conversations").status_code == 401


def test_a_tenant_is_created_with_the_cache_down(cache_down):
    from tenants.services import tenant_create

    tenant, raw_key = tenant_create(slug="fresh", name="Fresh")
    assert tenant.pk and raw_key


def test_a_refused_task_is_logged_and_reported_never_raised(broker_down, caplog):
    from conversations.tasks import message_vectors_conversation

    assert background.task_send(message_vectors_conversation, "c1") is False
    assert broker_down.refused == ["conversations.tasks.message_vectors_conversation"]
    assert "could not queue conversations.tasks.message_vectors_conversation" in caplog.text
    # While the broker is down, further sends do not wait on it again.
    assert background.task_send(message_vectors_conversation, "c2") is False
    assert len(broker_down.refused) == 1


def test_a_compaction_the_broker_refused_is_left_to_the_next_trigger(
    owner, conversation, broker_down, django_capture_on_commit_callbacks
):
    history(conversation, 20)
    with django_capture_on_commit_callbacks(execute=True):
        assert compaction_request(conversation=conversation, trigger="manual") is True
    assert broker_down.refused == ["summaries.tasks.compact_conversation"]
    assert CompactionState.objects.get(pk=conversation.pk).queued_at is None  # not left "queued" forever


@pytest.mark.django_db(transaction=True)  # the compaction is queued when the call's transaction commits
def test_a_context_call_with_the_broker_down_answers_and_reports_it(owner, conversation, broker_down):
    budgets(owner.tenant, history=1000)
    history(conversation, 20)  # past the background share: the call queues a compaction
    background._broker_down_until = 0.0  # the appends' refused tasks paused sending: try again
    response = owner.client.post(
        f"/api/v1/conversations/{conversation.pk}/context", {"user_message": "next?"}, format="json"
    )
    assert response.status_code == 200, response.content
    assert "summaries.tasks.compact_conversation" in broker_down.refused
    codes = {d["code"] for d in response.json()["degradations"]}
    assert "queue_unavailable" in codes
    assert CompactionState.objects.get(pk=conversation.pk).queued_at is None  # the sweep will queue it


@pytest.fixture
def fake_embedder(monkeypatch, settings):
    import numpy as np

    class Fake(embeddings.Embedder):
        name, dimension = "fake", 2

        def embed(self, texts):
            return np.ones((len(texts), 2), dtype=np.float32)

    status = embeddings.EmbedderStatus(embedder=Fake(), reason="")
    monkeypatch.setattr(embedding, "embedder_status", lambda: status)
    settings.MNEMO_EMBED_ON_APPEND = True
    return status


def test_the_sweep_queues_vectors_the_broker_never_took(
    owner, conversation, fake_embedder, broker_down, django_capture_on_commit_callbacks
):
    from conversations.services import conversation_create

    done = conversation_create(tenant=owner.tenant, title="embedded")
    append(done, {"role": "user", "content": "already embedded"})
    embedding.message_vectors_fill(conversation_id=done.pk)
    with django_capture_on_commit_callbacks(execute=True):
        append(conversation, {"role": "user", "content": "appended while Redis was down"})
    message_vectors_request(conversation_id=conversation.pk)  # refused, as the append's was
    assert MessageVector.objects.filter(conversation=conversation).count() == 0

    # The broker is back: the sweep finds the conversation (and only it) and its vectors are made.
    broker_down.up = True
    background._broker_down_until = 0.0
    assert message_vectors_sweep() == 1
    assert MessageVector.objects.filter(conversation=conversation).count() == 1
    assert message_vectors_sweep() == 0


def test_workers_reconnect_forever_and_a_lost_task_comes_back_within_the_visibility_timeout():
    from config.celery import app

    assert app.conf.broker_connection_retry_on_startup is True
    assert (
        app.conf.broker_connection_max_retries is None
    )  # before: 100 tries (~47 min), then the worker exits
    assert app.conf.task_acks_late is True
    visibility = app.conf.broker_transport_options["visibility_timeout"]
    # Long enough that no running task (nor a retry's countdown, at most 360 s) is handed out twice, and far
    # below the hour a killed worker's task used to wait.
    limits = [
        t.time_limit for name, t in app.tasks.items() if not name.startswith("celery.") and t.time_limit
    ]
    assert limits and max(limits) < visibility < 3600
    assert visibility > 360
    assert app.conf.broker_transport_options["unacked_restore_throttle"] == 1


@pytest.mark.django_db(transaction=True)
def test_a_socket_with_the_channel_layer_down_is_closed_with_try_again_later(owner, conversation, settings):
    from asgiref.sync import async_to_sync
    from channels.layers import channel_layers
    from channels.testing import WebsocketCommunicator

    from config.asgi import application
    from conversations.consumers import CLOSE_TRY_AGAIN

    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [DEAD_REDIS]}}
    }
    channel_layers.backends.clear()

    async def scenario() -> dict:
        socket = WebsocketCommunicator(
            application,
            f"/ws/conversations/{conversation.pk}/",
            headers=[(b"authorization", f"Bearer {owner.raw_key}".encode())],
        )
        connected, _ = await socket.connect(timeout=10)
        assert connected  # the handshake completes, so the client gets the close code
        closed = await socket.receive_output(timeout=5)
        await socket.disconnect()
        return closed

    try:
        closed = async_to_sync(scenario)()
    finally:
        channel_layers.backends.clear()
    assert closed == {"type": "websocket.close", "code": CLOSE_TRY_AGAIN, "reason": ""} or (
        closed["type"] == "websocket.close" and closed["code"] == CLOSE_TRY_AGAIN
    )
