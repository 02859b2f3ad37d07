"""The stack under soak: a uvicorn server and its Celery workers, embedded (SQLite) or distributed
(PostgreSQL, Redis), their environment and their resident memory."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import redis

from bench._server import HOST, PYTHON, manage, server_command, spawn, stop


def port_from(start: int) -> int:
    """The first port from `start` up to 8199 that nothing listens on."""
    for port in range(start, 8200):
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind((HOST, port))
            return port
    raise SystemExit("no free port in 8100-8199")


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (the embedded worker, a Celery pool), in MB."""
    total = 0
    for candidate in [pid, *children(pid)]:
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{candidate}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


@dataclass
class Stack:
    name: str
    env: dict[str, str]
    port: int
    var_dir: Path
    workers: int = 0
    server_processes: int = 1
    # uvicorn on config.asgi (`make run`: API and sockets in one process) or granian's WSGI workers on
    # config.wsgi (the production layout's API, docs/operations.md "Deploying"; it needs Redis).
    server: str = "uvicorn"
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    key: str = ""
    autovacuum: str = "n/a (SQLite)"  # what the run did about PostgreSQL's autovacuum (the report says)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def manage(self, *args: str) -> str:
        return manage(self.env, *args, timeout=300)

    def start(self) -> None:
        if "DATABASE_URL" in self.env:
            self.autovacuum = autovacuum_on(self.env["DATABASE_URL"])
        self.manage("migrate", "--noinput")
        self.key = json.loads(self.manage("create_tenant", "soak", "--name", "Soak", "--json"))["api_key"]
        command = server_command(self.server, self.server_processes, self.port)
        self.procs.append(self._spawn(command, "server.log"))
        self.workers_start(self.workers)
        self._wait_ready()

    def workers_start(self, count: int) -> None:
        """Celery workers of one process each (prefork, concurrency 1): a second worker is a second core."""
        for _ in range(count):
            n = len(self.procs)
            command = [
                PYTHON,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-l",
                "warning",
                "--concurrency",
                "1",
            ]
            self.procs.append(self._spawn([*command, "-n", f"soak{n}@%h"], f"worker{n}.log"))

    def _spawn(self, command: list[str], log_name: str) -> subprocess.Popen[bytes]:
        return spawn(command, self.env, self.var_dir / log_name)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.procs[0].poll() is not None:
                raise SystemExit(f"the server exited; see {self.var_dir / 'server.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return
            time.sleep(0.5)
        raise SystemExit("the server did not become ready")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop(proc, timeout=20)
        if self.autovacuum.startswith("turned on"):
            autovacuum_restore(self.env["DATABASE_URL"])

    def server_rss(self) -> float:
        return rss_mb(self.procs[0].pid)

    def workers_rss(self) -> float:
        """The Celery workers' (with their pools); embedded, the server's own worker process (which
        server_rss counts too)."""
        if len(self.procs) > 1:
            return sum(rss_mb(p.pid) for p in self.procs[1:])
        return sum(rss_mb(pid) for pid in children(self.procs[0].pid))


def _admin(database_url: str) -> str:
    return database_url.rsplit("/", 1)[0] + "/postgres"


def autovacuum_on(database_url: str) -> str:
    """PostgreSQL analyses tables as they fill (autovacuum, on by default); a server set up for test runs
    may have it off (this machine's CI configuration does), and then the soak's tables, filled from empty,
    are never analysed: the planner guesses, and the full-text searches scan whole tables. The soak runs as
    a user's server would: autovacuum on for the run (ALTER SYSTEM and a reload), the ALTER SYSTEM reset
    afterwards (autovacuum_restore), which leaves the configuration files' value."""
    with psycopg.connect(_admin(database_url), autocommit=True) as connection:
        row = connection.execute("SHOW autovacuum").fetchone()
        if row and row[0] == "on":
            return "on (the server's setting)"
        connection.execute("ALTER SYSTEM SET autovacuum = on")
        connection.execute("SELECT pg_reload_conf()")
    return "turned on for the run (the server had it off)"


def autovacuum_restore(database_url: str) -> None:
    with psycopg.connect(_admin(database_url), autocommit=True) as connection:
        connection.execute("ALTER SYSTEM RESET autovacuum")
        connection.execute("SELECT pg_reload_conf()")


def base_env(var_dir: Path, upstream: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env.update(
        DJANGO_SETTINGS_MODULE="config.django.local",
        DJANGO_DEBUG="false",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        MNEMO_VAR_DIR=str(var_dir),
        MNEMO_LOG_LEVEL="WARNING",
        LLM_BASE_URL=upstream,
        LLM_API_KEY="sk-soak-upstream",
        # Fast enough for a short soak to see the memory agent run, as it would over a longer one.
        MNEMO_MEMORY_AGENT_DELAY_SECONDS="2",
    )
    return env


# How each server serves the API, for the report.
SERVERS = {"granian": "granian WSGI on config.wsgi", "uvicorn": "uvicorn on config.asgi"}


def embedded_stack(var_dir: Path, upstream: str, port: int) -> Stack:
    return Stack("embedded (SQLite, worker process)", base_env(var_dir, upstream), port, var_dir)


def distributed_stack(
    var_dir: Path,
    upstream: str,
    port: int,
    database_url: str,
    redis_url: str,
    workers: int = 1,
    server_processes: int = 1,
    server: str = "granian",
) -> Stack:
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(_admin(database_url), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    redis.Redis.from_url(redis_url).flushdb()
    env = base_env(var_dir, upstream)
    env.update(DATABASE_URL=database_url, REDIS_URL=redis_url)
    layout = SERVERS[server]
    servers = f"{server_processes} server process{'es' if server_processes > 1 else ''}"
    workers_named = f"{workers} Celery worker{'s' if workers > 1 else ''}"
    name = f"distributed (PostgreSQL, Redis, {layout}, {servers}, {workers_named})"
    return Stack(name, env, port, var_dir, workers, server_processes, server=server)
