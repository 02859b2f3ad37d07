"""The HTTP servers under test (granian on config.wsgi, uvicorn on config.asgi), started and stopped."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from bench._append.backend import Backend
from bench._append.client import HttpConnection, request_head
from bench._server import BIN, HOST, PYTHON, free_port, spawn, stop

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


@contextlib.contextmanager
def http_server(
    backend: Backend, server: str, workers: int, api_key: str
) -> Iterator[tuple[int, subprocess.Popen]]:
    port = free_port()
    log_path = backend.var_dir / f"{server}-{workers}w.log"
    proc = spawn(server_command(server, workers, port), backend.env, log_path)
    try:
        wait_ready(port, api_key, proc, log_path)
        yield port, proc
    finally:
        stop(proc)


def wait_ready(port: int, api_key: str, proc: subprocess.Popen, log_path: Path) -> None:
    head = request_head("GET", "/api/v1/conversations?limit=1", api_key, port, b"")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            status, payload = asyncio.run(HttpConnection(port).request(head))
        except OSError:
            time.sleep(0.2)
            continue
        if status == 200:
            return
        raise RuntimeError(f"server answered HTTP {status}: {payload[:500]!r}")
    raise RuntimeError(f"the server did not answer within 60s:\n{log_path.read_text()[-3000:]}")
