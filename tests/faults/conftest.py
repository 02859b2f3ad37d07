"""Real processes for the fault tests: a redis-server on a spare port that a test stops and starts again
(skipped when the binary is missing), the Celery app of this process pointed at it, and `celery -A config
worker` subprocesses against it and the test database (PostgreSQL: the worker must see the test's rows)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from config.celery import app
from providers import background
from tests.celery_conf import celery_conf_changed

REPO = Path(__file__).resolve().parents[2]
# One port per pytest-xdist worker (gw0 on the first, gw1 on the next): each worker's fault tests stop and
# start their own redis-server.
SPARE_PORT = int(os.environ.get("MNEMO_FAULTS_REDIS_PORT", "6391")) + int(
    os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
)


def wait_for(
    condition: Callable[[], object],
    *,
    timeout: float,
    what: str,
    detail: Callable[[], str] | None = None,
) -> object:
    """Poll until condition() is truthy; fail after `timeout` seconds (a bound, not a timed assertion), with
    detail() (say, a worker's log) in the message."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s" + (f"\n{detail()}" if detail else ""))
        time.sleep(0.1)


class RedisServer:
    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.process: subprocess.Popen | None = None

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def start(self) -> None:
        if self._answers():
            pytest.fail(f"port {self.port} is taken by another Redis; set MNEMO_FAULTS_REDIS_PORT")
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._answers, timeout=10, what="redis-server answering")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None
        wait_for(lambda: not self._answers(), timeout=10, what="redis-server stopped")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("needs the redis-server binary")
    server = RedisServer(SPARE_PORT)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _reset_broker_pools() -> None:
    app.amqp._producer_pool = None
    app._pool = None


@pytest.fixture
def distributed(settings, redis_server, monkeypatch) -> Iterator[RedisServer]:
    """This process in distributed mode on the spare Redis: cache, compaction lock and Celery broker."""
    settings.REDIS_URL = redis_server.url
    settings.CACHES = {
        "default": {
            "BACKEND": "providers.redis_cache.RedisCache",
            "LOCATION": redis_server.url,
            "KEY_PREFIX": "faults",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
        }
    }
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.MNEMO_EAGER_TASKS_IN_THREAD = False
    monkeypatch.setattr(background, "BROKER_PAUSE_SECONDS", 0.0)
    options = {**settings.CELERY_BROKER_TRANSPORT_OPTIONS, "socket_connect_timeout": 1}
    with celery_conf_changed(
        broker_url=redis_server.url, task_always_eager=False, broker_transport_options=options
    ):
        _reset_broker_pools()
        try:
            yield redis_server
        finally:
            _reset_broker_pools()


@pytest.fixture
def services_database():
    """The worker subprocesses read and write the test's rows: they need PostgreSQL (not SQLite in memory)."""
    if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        pytest.skip("needs DATABASE_URL and REDIS_URL (the PostgreSQL/Redis run)")
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    return connection.settings_dict


class Worker:
    """`celery -A config worker`: the solo pool by default (one process, so SIGKILL takes the whole worker
    down); `pool="prefork"` forks one child that runs the tasks, as a deployed worker does."""

    def __init__(
        self, *, redis_url: str, database: dict, log: Path, env: dict[str, str], pool: str = "solo"
    ) -> None:
        db = database
        self.log = log
        self.pool = pool
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.django.test",
            "DATABASE_URL": f"postgres://{db['USER']}:{db.get('PASSWORD') or ''}@{db['HOST'] or '127.0.0.1'}:"
            f"{db['PORT'] or 5432}/{db['NAME']}",
            "REDIS_URL": redis_url,
            "MNEMO_LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            # At the test process's priority: these tests bound how long a redelivery takes, and a worker
            # below the priority of the test and the database would stretch that on a busy machine.
            "MNEMO_BACKGROUND_NICE": "0",
            # A worker with a broker sends what it queues (a retry with its countdown) through it; eager, the
            # retry of a busy lock ran at once inside the worker, found the lock still held, and was lost.
            "MNEMO_TEST_CELERY_WORKER": "1",
            **env,
        }
        self.process: subprocess.Popen | None = None

    def start(self) -> "Worker":
        command = [
            str(Path(sys.executable).with_name("celery")),
            "-A",
            "config",
            "worker",
            f"--pool={self.pool}",
            "--concurrency=1",
            "--loglevel=INFO",
            "--without-mingle",
            "--without-gossip",
            f"--hostname=faults-{os.getpid()}-{time.monotonic_ns()}@%h",
        ]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(command, cwd=REPO, env=self.env, stdout=out, stderr=out)
        wait_for(lambda: "ready." in self.output() or not self.alive(), timeout=30, what="worker ready")
        assert self.alive(), self.output()[-3000:]
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGQUIT)  # cold shutdown: nothing of the test's is left to finish
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


@pytest.fixture
def workers(distributed, services_database, tmp_path) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(pool: str = "solo", **env: str) -> Worker:
        worker = Worker(
            redis_url=distributed.url,
            database=services_database,
            log=tmp_path / f"worker-{len(started)}.log",
            env=env,
            pool=pool,
        )
        started.append(worker)
        return worker.start()

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()
