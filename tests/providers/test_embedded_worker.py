"""The embedded mode's worker process (providers.embedded_worker): a real child process runs the tasks the
server queues, once each while they wait, and hands back what only the server can do: its sockets' events,
and runs a task queued again once it has started. A child that died is started again by the next task."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from django.core.cache import cache

from conversations import events
from conversations.events import conversation_group
from providers import background
from providers.background import (
    background_join,
    server_handler,
    task_queue_once,
    task_send,
    task_started,
)
from providers.embedded_child import protocol_sender
from tests.providers.worker.tasks import echo, fill, publish


def test_tasks_run_in_a_child_process_once_while_they_wait(worker):
    for _ in range(4):
        task_send(echo, "a")  # the first is handed to the child at once; the three after it wait together
    task_send(echo, "b")
    background_join()

    assert [value for _pid, value in worker] == ["a", "a", "b"]
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


def test_the_childs_events_reach_the_servers_sockets(worker, monkeypatch):
    # The server's own _send (its channel layer, tested in tests/conversations) gets what the child published.
    sent: list = []
    monkeypatch.setattr(events, "_send", lambda group, message: sent.append((group, message)))
    tenant_id, conversation_id = uuid.uuid4(), uuid.uuid4()

    task_send(publish, str(tenant_id), str(conversation_id))
    background_join()

    [(group, message)] = sent
    assert group == conversation_group(tenant_id=tenant_id, conversation_id=conversation_id)
    assert message["event"] == "summary.updated"
    assert message["data"] == {"n": 1}


def test_a_request_while_a_run_reads_queues_the_next_run(worker, tmp_path):
    # The run has read what was appended, but the server has not yet heard that it started (its reader is
    # busy): an append then must still get a run that reads it, not be folded into the one already reading.
    MARK = "mnemo:test:fill"
    store, seen = tmp_path / "appended", tmp_path / "appended.seen"
    store.write_text("first\n")
    held, release = threading.Event(), threading.Event()
    server_handler("test_hold", lambda _payload: (held.set(), release.wait(30)))
    task_queue_once(fill, str(store), MARK, mark=MARK, mark_seconds=300)
    deadline = time.monotonic() + 30
    while not seen.exists():
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.05)

    with store.open("a") as appended:
        appended.write("second\n")
    task_queue_once(fill, str(store), MARK, mark=MARK, mark_seconds=300)
    release.set()
    background_join()

    assert held.is_set()
    assert seen.read_text() == "2"


def test_with_a_broker_a_burst_shares_one_run_and_a_started_run_lets_the_next_queue(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    sent: list = []

    class Recorded:
        name = "tests.recorded"

        def apply_async(self, args, countdown=None):
            sent.append((args, countdown))

    for _ in range(3):
        assert task_queue_once(Recorded(), "c1", mark="mnemo:test:once", mark_seconds=300, countdown=5)
    assert sent == [(("c1",), 5)]

    task_started("mnemo:test:once")
    task_queue_once(Recorded(), "c1", mark="mnemo:test:once", mark_seconds=300)
    assert len(sent) == 2
    cache.delete("mnemo:test:once")


# --- the embedded server, end to end ------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def _call(url: str, key: str, method: str = "GET", body: dict | None = None) -> dict:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _children(pid: int) -> list[str]:
    """The command lines of a process's children (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
    return found


@contextlib.contextmanager
def embedded_server_running(var_dir: Path, **overrides: str):
    """A real server (uvicorn on config.asgi, a tenant of its own) in the embedded mode, or as `overrides`
    configure it; yields (process, base URL, API key)."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env.update(
        DJANGO_SETTINGS_MODULE="config.django.local",
        MNEMO_VAR_DIR=str(var_dir),
        MNEMO_EMBEDDED_BEAT="false",
        MNEMO_WARM_ON_START="false",
        **overrides,
    )

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    manage("migrate", "--noinput")
    key = json.loads(manage("create_tenant", "acme", "--name", "Acme", "--json"))["api_key"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "config.asgi:application",
            "--port",
            str(port),
            "--lifespan",
            "off",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{url}/healthz", timeout=2)
                break
            assert time.monotonic() < deadline and server.poll() is None, "the server did not start"
            time.sleep(0.2)
        yield server, url, key
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def embedded_server(tmp_path):
    with embedded_server_running(tmp_path) as running:
        yield running


def test_the_embedded_server_embeds_appended_messages_in_its_worker_process(embedded_server):
    server, url, key = embedded_server
    conversation = _call(f"{url}/api/v1/conversations", key, "POST", {"end_user": "alice"})["id"]
    lines = ["The staging ledger listens on port 23456.", "Noted.", "The cache is Redis 7.", "Thanks."]
    messages = [{"role": ("user", "assistant")[n % 2], "content": text} for n, text in enumerate(lines)]
    _call(f"{url}/api/v1/conversations/{conversation}/messages", key, "POST", {"messages": messages})

    deadline = time.monotonic() + 90
    while (index := _call(f"{url}/api/v1/conversations/{conversation}", key)["retrieval_index"])[
        "embedded"
    ] < 4:
        assert time.monotonic() < deadline, index
        time.sleep(0.5)

    workers = [c for c in _children(server.pid) if "providers.embedded_child" in c]
    assert len(workers) == 1  # the vectors were computed there, not on a thread of the server
    body = {"user_message": "Which port does the ledger use?", "token_budget": 2000}
    context = _call(f"{url}/api/v1/conversations/{conversation}/context", key, "POST", body)
    assert "embeddings_unavailable" not in {d["code"] for d in context["degradations"]}
    server.terminate()
    server.wait(timeout=30)
    deadline = time.monotonic() + 10
    while [c for c in _children(server.pid) if "providers.embedded_child" in c]:
        assert time.monotonic() < deadline, "the worker outlived its server"
        time.sleep(0.2)


def test_appends_racing_the_running_fill_all_get_vectors_without_the_sweep(embedded_server):
    # One append at a time while the worker process fills: each append lands before, during or after a
    # run's reads, and the last one must still be embedded by a run of its own, with no sweep (the embedded
    # beat is off) and no context call to find it. Whether a given run meets the unlucky interleaving is up
    # to the scheduler; test_a_request_while_a_run_reads_queues_the_next_run forces it.
    _server, url, key = embedded_server
    conversation = _call(f"{url}/api/v1/conversations", key, "POST", {"end_user": "alice"})["id"]
    for n in range(60):
        text = f"Build {n} of the ledger passed its checks at 10:{n % 60:02d} on runner {n * 7 % 13}."
        _call(
            f"{url}/api/v1/conversations/{conversation}/messages",
            key,
            "POST",
            {"role": "user", "content": text},
        )

    deadline = time.monotonic() + 60
    while (index := _call(f"{url}/api/v1/conversations/{conversation}", key)["retrieval_index"])[
        "embedded"
    ] < 60:
        assert time.monotonic() < deadline, index
        time.sleep(0.5)


def test_a_worker_that_cannot_start_is_logged_not_raised(worker, monkeypatch, caplog):
    from providers import embedded_worker

    def refuse(*args, **kwargs):
        raise OSError("no processes left")

    monkeypatch.setattr(embedded_worker.subprocess, "Popen", refuse)

    assert task_send(echo, "lost") is False
    assert "could not start the embedded worker" in caplog.text
    assert worker == []


def test_the_child_says_nothing_more_once_the_server_has_gone():
    read, write = os.pipe()
    protocol = os.fdopen(write, "w", buffering=1)
    send = protocol_sender(protocol)
    send({"started": 1})
    assert json.loads(os.read(read, 100)) == {"started": 1}
    os.close(read)  # the server exited while a task ran

    send({"done": 1})  # a broken pipe: no error reaches the task
    send({"kind": "warm", "payload": "x"})  # nor afterwards
