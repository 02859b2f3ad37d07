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
from bench._server import free_port, server_command, spawn, stop


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
