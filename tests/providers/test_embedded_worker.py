"""The embedded mode's worker process (providers.embedded_worker): a real child process runs the tasks the
server queues, once each while they wait, and hands back what only the server can do: its sockets' events,
its cache's queued marks. A child that died is started again by the next task."""

import os
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core.cache import cache

from conversations.events import conversation_group
from providers import background
from providers.background import background_join, server_handler, task_send
from tests.providers.worker.tasks import clear_mark, echo, publish


@pytest.fixture
def worker(settings, monkeypatch):
    settings.MNEMO_EAGER_TASKS_IN_THREAD = True
    settings.MNEMO_EMBEDDED_WORKER = "process"
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.providers.worker.settings")  # the child's
    heard: list = []
    server_handler("test_echo", heard.append)
    yield heard
    if background._worker is not None:
        background._worker.stop()
        background._worker = None


def test_tasks_run_in_a_child_process_once_while_they_wait(worker):
    for _ in range(3):
        task_send(echo, "a")  # the child is still starting: the three wait together
    task_send(echo, "b")
    background_join()

    assert [value for _pid, value in worker] == ["a", "b"]
    assert {pid for pid, _value in worker} != {os.getpid()}


def test_a_dead_child_is_started_again_by_the_next_task(worker):
    task_send(echo, "first")
    background_join()
    background._worker._process.kill()
    background._worker._process.wait()

    task_send(echo, "second")
    background_join()

    assert [value for _pid, value in worker] == ["first", "second"]
    assert worker[0][0] != worker[1][0]


def test_the_childs_events_reach_the_servers_sockets(worker):
    tenant_id, conversation_id = uuid.uuid4(), uuid.uuid4()
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(
        conversation_group(tenant_id=tenant_id, conversation_id=conversation_id), channel
    )

    task_send(publish, str(tenant_id), str(conversation_id))
    background_join()

    message = async_to_sync(layer.receive)(channel)
    assert message["event"] == "summary.updated"
    assert message["data"] == {"n": 1}


def test_a_queued_mark_the_child_clears_is_cleared_in_the_server(worker):
    cache.set("mnemo:test:queued", 1, timeout=300)

    task_send(clear_mark, "mnemo:test:queued")
    background_join()

    assert cache.get("mnemo:test:queued") is None
