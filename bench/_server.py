"""What the benchmarks that start real processes share: a free port, manage.py, the servers' command lines, a
child in a session of its own and its stopping, the server's environment, and a throwaway PostgreSQL database.

Not a benchmark itself; nothing here runs on import.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg

from bench._common import REPO, log

HOST = "127.0.0.1"
PYTHON = sys.executable
BIN = Path(PYTHON).parent


# granian runs the WSGI app on this many threads per worker, as uvicorn does on MNEMO_HTTP_THREADS: the views
# hold the GIL most of the time, so more threads did not serve more appends.
GRANIAN_THREADS = 4


def server_command(server: str, workers: int, port: int) -> list[str]:
    """The two ways the README gives to serve the API: uvicorn on config.asgi (API and WebSockets in one
    process: `make run`), or granian's WSGI workers on config.wsgi for the API beside a uvicorn for the
    sockets (the production layout, docs/operations.md "Deploying")."""
    if server == "granian":
        return [
            str(BIN / "granian"), "--interface", "wsgi", "config.wsgi:application",
            "--host", HOST, "--port", str(port), "--workers", str(workers),
            "--blocking-threads", str(GRANIAN_THREADS), "--no-ws",
            "--log-level", "warning", "--no-access-log",
        ]  # fmt: skip
    return [
        PYTHON, "-m", "uvicorn", "config.asgi:application",
        "--host", HOST, "--port", str(port), "--workers", str(workers),
        "--log-level", "warning", "--no-access-log", "--lifespan", "off",
    ]  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def manage(env: dict[str, str], *args: str, timeout: float | None = None) -> str:
    done = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr[-3000:]}")
    return done.stdout


def server_env(var_dir: Path, *, secret_key: str = "", **extra: str) -> dict[str, str]:
    """This process's environment for a server on `var_dir`, without DEBUG (it would keep every SQL statement
    in memory) and without the shell's database, broker or settings module: `extra` names those it wants."""
    skip = {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "CELERY_TASK_ALWAYS_EAGER"}
    env = {k: v for k, v in os.environ.items() if k not in skip}
    env.update(
        DJANGO_SETTINGS_MODULE="config.django.local",
        DJANGO_DEBUG="false",
        DJANGO_SECRET_KEY=secret_key or secrets.token_urlsafe(50),
        DJANGO_ALLOWED_HOSTS=HOST,
        MNEMO_VAR_DIR=str(var_dir),
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.update(extra)
    return env


def spawn(
    command: list[str], env: dict[str, str], log_path: Path, mode: str = "wb"
) -> subprocess.Popen[bytes]:
    """A child in a session of its own: Ctrl-C reaches only us, and its workers can be killed with it."""
    with open(log_path, mode) as log_file:
        return subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # The supervisor is gone; make sure no worker of its session outlived it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def process(command: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """spawn(), stopped at the end whatever happened."""
    proc = spawn(command, env, log_path, mode="ab")
    try:
        yield proc
    finally:
        stop(proc)


def log_tail(log_path: Path) -> str:
    return log_path.read_text(errors="replace")[-3000:]


@contextlib.contextmanager
def throwaway_database(
    admin_url: str, name: str = "", before_drop: Callable[[], None] | None = None
) -> Iterator[str]:
    """A fresh, empty database on the server of `admin_url`; dropped afterwards whatever happened."""
    name = name or f"mnemo_bench_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        if before_drop:
            before_drop()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        log(f"dropped database {name}")


def server_version(pg_url: str) -> str:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]).split()[0] if row else "?"
