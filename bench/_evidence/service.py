"""The server the run talks to: started here (uvicorn, and a Celery worker with Redis) or already running."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from bench._server import BIN, HOST, free_port, manage, process, server_env


@dataclass
class Service:
    url: str
    api_key: str
    describe: str
    log_path: Path | None = None


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
    return urlunsplit(parts)


def identity(args: argparse.Namespace) -> dict[str, str]:
    """What a kept load belongs to: reused only by a run against the same kind of server."""
    if args.url:
        return {"mode": "url", "url": args.url}
    if args.database_url:
        return {"mode": "postgres", "database_url": redact(args.database_url)}
    return {"mode": "sqlite"}


def secret_key(var_dir: Path) -> str:
    # DEBUG is off (it would keep every SQL statement in memory), so the server needs a key; it is kept
    # with the data so that a kept load is served the same way next time.
    path = var_dir / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def evidence_server_env(args: argparse.Namespace, var_dir: Path) -> dict[str, str]:
    return server_env(
        var_dir,
        secret_key=secret_key(var_dir),
        MNEMO_LOG_LEVEL=os.environ.get("MNEMO_LOG_LEVEL", "WARNING"),
        # Empty counts as unset in config/env.py, and stops a .env file from filling these in.
        DATABASE_URL=args.database_url or "",
        REDIS_URL=args.redis_url or "",
    )


def wait_ready(url: str, api_key: str, proc: subprocess.Popen, log_path: Path) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            response = httpx.get(f"{url}/api/v1/conversations?limit=1", headers=headers, timeout=5)
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        if response.status_code != 200:
            raise SystemExit(f"the server answered HTTP {response.status_code}: {response.text[:500]}")
        # Ready as a load balancer sees it: its start-up warm-up (tokenizers, recent indexes) is done.
        if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
            return
        time.sleep(0.2)
    raise SystemExit(f"the server was not ready within 120 s:\n{log_path.read_text()[-3000:]}")


@contextlib.contextmanager
def started_service(args: argparse.Namespace, var_dir: Path, api_key: str | None) -> Iterator[Service]:
    """migrate, a tenant (unless a kept load brings its key), uvicorn (and a Celery worker with Redis)."""
    env = evidence_server_env(args, var_dir)
    manage(env, "migrate", "--noinput")
    if api_key is None:
        slug = f"evidence-recall-{int(time.time())}"
        out = manage(env, "create_tenant", slug, "--name", "evidence recall bench", "--json")
        api_key = json.loads(out.strip().splitlines()[-1])["api_key"]
    port = free_port()
    uvicorn = [str(BIN / "uvicorn"), "config.asgi:application", "--host", HOST, "--port", str(port)]
    uvicorn += ["--lifespan", "off", "--log-level", "warning", "--no-access-log"]
    log_path = var_dir / "server.log"
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(process(uvicorn, env, log_path))
        if args.redis_url:
            worker = [str(BIN / "celery"), "-A", "config", "worker", "-l", "warning"]
            stack.enter_context(process(worker, env, var_dir / "celery.log"))
        url = f"http://{HOST}:{port}"
        wait_ready(url, api_key, server, log_path)
        yield Service(url, api_key, describe_server(args, var_dir), log_path)


def describe_server(args: argparse.Namespace, var_dir: Path) -> str:
    if args.url:
        return f"server: already running at {args.url} (not started here)"
    where = f"uvicorn config.asgi --lifespan off, 1 process, started here; var dir {var_dir}"
    if not args.database_url:
        worker = os.environ.get("MNEMO_EMBEDDED_WORKER") or "process"
        tasks = (
            "in a worker process the server starts" if worker == "process" else "on a thread of the server"
        )
        return f"server: {where}; SQLite embedded, Celery eager, background tasks {tasks}"
    broker = f"Redis {redact(args.redis_url)} with a Celery worker" if args.redis_url else "Celery eager"
    return f"server: {where}; PostgreSQL {redact(args.database_url)}; {broker}"


def workspace(args: argparse.Namespace, stack: contextlib.ExitStack) -> Path | None:
    if args.var_dir:
        args.var_dir.mkdir(parents=True, exist_ok=True)
        return args.var_dir.resolve()
    if args.url:
        return None
    return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mnemo-bench-er-")))


def open_service(
    args: argparse.Namespace, stack: contextlib.ExitStack, var_dir: Path | None, key: Any
) -> Service:
    if args.url:
        return Service(args.url, args.api_key, describe_server(args, var_dir or Path()))
    assert var_dir is not None
    return stack.enter_context(started_service(args, var_dir, key))
