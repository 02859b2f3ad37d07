"""The server under test: granian on config.asgi with the proxy's environment, started and awaited."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import httpx

from bench._server import BIN, HOST, server_env, spawn


def proxy_env(scratch: Path, database_url: str, upstream_url: str) -> dict[str, str]:
    return server_env(
        scratch,
        DATABASE_URL=database_url, REDIS_URL="", LLM_BASE_URL=upstream_url, LLM_API_KEY="k",
        MNEMO_PROXY_DEADLINE_SECONDS="60", MNEMO_WARM_ON_START="true", MNEMO_LOG_LEVEL="WARNING",
        # Message vectors are a worker's job in a deployment; here they would embed the seeded messages on
        # the server's own cores while it is measured.
        MNEMO_EMBED_ON_APPEND="false",
        # Background tasks (memory agent, compaction) are queued, not run on the server's threads: in a
        # deployment a worker runs them, and here they would take the GIL from the streams measured.
        CELERY_TASK_ALWAYS_EAGER=os.environ.get("BENCH_PROXY_EAGER", "false"),
    )  # fmt: skip


def server(env: dict[str, str], workers: int, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    command = [
        str(BIN / "granian"), "--interface", "asginl", "config.asgi:application",
        "--host", HOST, "--port", str(port), "--workers", str(workers), "--no-ws",
        "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
    return spawn(command, env, log_path)


def wait_ready(port: int, key: str, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"granian exited:\n{log_path.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            models = httpx.get(f"http://{HOST}:{port}/v1/models", headers={"Authorization": f"Bearer {key}"})
            # Ready as a load balancer sees it: the start-up warm-up (tokenizers, recent indexes) is done.
            if models.status_code == 200 and httpx.get(f"http://{HOST}:{port}/readyz").status_code == 200:
                return
        time.sleep(0.3)
    raise RuntimeError(f"granian did not answer:\n{log_path.read_text()[-3000:]}")
