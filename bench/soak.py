"""Soak: a real server under sustained mixed load, once in the embedded default (SQLite, the server's own
worker process) and once distributed (PostgreSQL, Redis, a Celery worker), as a user would run them.

16 clients, each with a conversation of its own, append (single messages and batches, with `created_at`, and
`name` when the server takes it), ask for context at several budgets, stream through the chat proxy against
a local fake upstream (tests/llm_server.py), import a transcript, upload a document and edit core memory,
paced to a total request rate. Reported per configuration: requests by status, HTML error bodies, p50/p99 per
endpoint, messages acknowledged versus stored, seq gaps, the embedding lag (append acknowledged -> vector
written) and the backlog of messages without vectors over time, how long the backlog takes to drain once the
load stops, tasks left queued, the memory agent caught up, and the server's resident memory (minute 2 and
the end).

Run from the repository root:  .venv/bin/python bench/soak.py   (or: make bench-soak)
Options: --minutes N (default 10), --short (2 minutes), --only embedded|distributed, --clients N (16),
--rate N (requests per second, all clients together; default 20), --port N (first port, 8100),
--database-url URL and --redis-url URL (the distributed run; its database is dropped and created again).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import REPO, log, machine_header, percentile, render_table

HOST = "127.0.0.1"
PYTHON = sys.executable
BUDGETS = [1000, 4000, 16000]
# What a client does next, with its weight: mostly appends and context calls, as an agent loop makes them.
ACTIONS = {
    "append": 40,
    "append_batch": 12,
    "context": 26,
    "proxy_stream": 8,
    "memory_edit": 6,
    "import_transcript": 4,
    "document": 4,
}
WORDS = [
    "deploy", "export", "invoice", "ledger", "queue", "worker", "retry", "cache", "token", "budget",
    "summary", "migration", "schema", "index", "latency", "staging", "billing", "report", "storage",
    "timeout", "customer", "session", "audit", "usage", "Priya", "Jonas", "Mei", "Luca",
]  # fmt: skip


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(8, 40))]
    return " ".join(words).capitalize() + f" (ticket {rng.randint(100, 99999)})."


# --- the stack under test -----------------------------------------------------------------------------------


def free_port(start: int) -> int:
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
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    key: str = ""

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [PYTHON, "manage.py", *args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=300
        )
        if done.returncode:
            raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def start(self) -> None:
        self.manage("migrate", "--noinput")
        self.key = json.loads(self.manage("create_tenant", "soak", "--name", "Soak", "--json"))["api_key"]
        server = [
            PYTHON,
            "-m",
            "uvicorn",
            "config.asgi:application",
            "--host",
            HOST,
            "--port",
            str(self.port),
        ]
        self.procs.append(self._spawn([*server, "--lifespan", "off", "--no-access-log"], "server.log"))
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
        out = open(self.var_dir / log_name, "wb")  # noqa: SIM115 - the process keeps writing to it
        return subprocess.Popen(
            command, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _wait_ready(self) -> None:
        import httpx

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
        import signal

        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    def server_rss(self) -> float:
        return rss_mb(self.procs[0].pid)

    def workers_rss(self) -> float:
        return sum(rss_mb(p.pid) for p in self.procs[1:])


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


def embedded_stack(var_dir: Path, upstream: str, port: int) -> Stack:
    return Stack("embedded (SQLite, worker process)", base_env(var_dir, upstream), port, var_dir)


def distributed_stack(
    var_dir: Path, upstream: str, port: int, database_url: str, redis_url: str, workers: int = 1
) -> Stack:
    import psycopg
    import redis

    name = database_url.rsplit("/", 1)[1]
    admin = database_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    redis.Redis.from_url(redis_url).flushdb()
    env = base_env(var_dir, upstream)
    env.update(DATABASE_URL=database_url, REDIS_URL=redis_url)
    name = f"distributed (PostgreSQL, Redis, {workers} Celery worker{'s' if workers > 1 else ''})"
    return Stack(name, env, port, var_dir, workers=workers)


# --- reading the database behind the server -----------------------------------------------------------------


class Store:
    """Read-only queries on the server's database: what was stored, and when each vector was written."""

    def __init__(self, stack: Stack) -> None:
        self.url = stack.env.get("DATABASE_URL", "")
        self.path = stack.var_dir / "db.sqlite3"

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        if self.url:
            import psycopg

            with psycopg.connect(self.url) as connection:
                return list(connection.execute(sql).fetchall())
        import sqlite3

        connection = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30)
        try:
            return list(connection.execute(sql).fetchall())
        finally:
            connection.close()

    def backlog(self) -> int:
        return self.rows(
            "SELECT count(*) FROM conversations_message m WHERE m.kind = 'message' AND NOT EXISTS "
            "(SELECT 1 FROM conversations_messagevector v WHERE v.message_id = m.id)"
        )[0][0]

    def messages(self) -> dict[str, tuple[str, int]]:
        rows = self.rows("SELECT id, conversation_id, seq FROM conversations_message")
        return {str(uuid.UUID(str(m))): (str(uuid.UUID(str(c))), s) for m, c, s in rows}

    def vector_times(self) -> dict[str, float]:
        rows = self.rows("SELECT message_id, created_at FROM conversations_messagevector")
        return {str(uuid.UUID(str(m))): _timestamp(t) for m, t in rows}


def _timestamp(value: Any) -> float:
    if isinstance(value, str):  # SQLite: UTC without an offset
        value = datetime.fromisoformat(value).replace(tzinfo=UTC)
    return value.timestamp()


# --- the clients --------------------------------------------------------------------------------------------


@dataclass
class Record:
    endpoint: str
    status: int
    ms: float
    html: bool


@dataclass
class Shared:
    url: str
    key: str
    deadline: float
    interval: float  # seconds between one client's requests
    names: bool
    actions: dict[str, int] = field(default_factory=lambda: dict(ACTIONS))
    upstream_model: str = "gpt-4o"
    records: list[Record] = field(default_factory=list)
    acked: dict[str, float] = field(default_factory=dict)  # message id -> when its append was answered
    conversations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Client:
    def __init__(self, shared: Shared, n: int) -> None:
        import httpx

        self.shared, self.n = shared, n
        self.rng = random.Random(n)
        self.http = httpx.Client(
            base_url=shared.url, timeout=60, headers={"Authorization": f"Bearer {shared.key}"}
        )
        self.user = f"user-{n}"
        self.conversation = ""
        self.proxy_conversation = ""
        self.turn = 0

    def call(self, endpoint: str, method: str, path: str, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            response = self.http.request(method, path, **kwargs)
        except Exception as exc:  # a refused or dropped connection counts as a failure, status 0
            self.shared.records.append(Record(endpoint, 0, (time.perf_counter() - started) * 1000, False))
            self.shared.errors.append(f"{endpoint}: {exc!r}")
            return None
        ms = (time.perf_counter() - started) * 1000
        html = response.headers.get("content-type", "").startswith("text/html")
        self.shared.records.append(Record(endpoint, response.status_code, ms, html))
        if response.status_code >= 500:
            self.shared.errors.append(f"{endpoint} {response.status_code}: {response.text[:300]}")
        return response

    def run(self) -> None:
        created = self.call("conversation", "POST", "/api/v1/conversations", json={"end_user": self.user})
        self.conversation = created.json()["id"]
        self.shared.conversations.append(self.conversation)
        actions, weights = list(self.shared.actions), list(self.shared.actions.values())
        while time.monotonic() < self.shared.deadline:
            began = time.monotonic()
            getattr(self, self.rng.choices(actions, weights)[0])()
            time.sleep(
                max(0.0, self.rng.uniform(0.5, 1.5) * self.shared.interval - (time.monotonic() - began))
            )
        self.http.close()

    def message(self, role: str) -> dict[str, Any]:
        item = {"role": role, "content": sentence(self.rng), "created_at": datetime.now(UTC).isoformat()}
        if self.shared.names:
            item["name"] = f"agent-{self.n}" if role == "assistant" else f"person-{self.n}"
        return item

    def _ack(self, messages: list[dict[str, Any]]) -> None:
        now = time.time()
        for message in messages:
            self.shared.acked[message["id"]] = now

    def append(self) -> None:
        self.turn += 1
        body = self.message("user" if self.turn % 2 else "assistant")
        response = self.call(
            "append", "POST", f"/api/v1/conversations/{self.conversation}/messages", json=body
        )
        if response is not None and response.status_code in (200, 201):
            self._ack([response.json()])

    def append_batch(self) -> None:
        items = [self.message(("user", "assistant")[i % 2]) for i in range(self.rng.randint(2, 6))]
        path = f"/api/v1/conversations/{self.conversation}/messages"
        response = self.call("append_batch", "POST", path, json={"messages": items})
        if response is not None and response.status_code in (200, 201):
            self._ack(response.json()["messages"])

    def context(self) -> None:
        budget = BUDGETS[self.rng.randrange(len(BUDGETS))]
        body = {"user_message": sentence(self.rng), "token_budget": budget}
        self.call(
            f"context {budget}", "POST", f"/api/v1/conversations/{self.conversation}/context", json=body
        )

    def proxy_stream(self) -> None:
        """A streamed chat completion on a conversation of the proxy's own (its turns are not counted as
        this client's acknowledged appends)."""
        messages = [{"role": "user", "content": sentence(self.rng)}]
        headers = {"X-Mnemo-User": self.user}
        if self.proxy_conversation:
            headers["X-Mnemo-Conversation"] = self.proxy_conversation
        body = {"model": self.shared.upstream_model, "messages": messages, "stream": True}
        started = time.perf_counter()
        try:
            with self.http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                text = "".join(response.iter_text())
                status = response.status_code
                html = response.headers.get("content-type", "").startswith("text/html")
                self.proxy_conversation = response.headers.get(
                    "x-mnemo-conversation", self.proxy_conversation
                )
        except Exception as exc:
            status, html, text = 0, False, repr(exc)
        self.shared.records.append(
            Record("proxy_stream", status, (time.perf_counter() - started) * 1000, html)
        )
        if status >= 500 or status == 0 or '"error"' in text:
            self.shared.errors.append(f"proxy_stream {status}: {text[:300]}")

    def memory_edit(self) -> None:
        """A support-style edit of a core memory block: created once, then replaced at its version."""
        path = f"/api/v1/users/{self.user}/memory/blocks/notes"
        line = f"Prefers build {self.rng.randint(1, 999)} reports on {self.rng.choice(WORDS)}."
        current = self.call("memory_read", "GET", path)
        if current is None:
            return
        if current.status_code == 404:
            self.call("memory_edit", "PUT", path, json={"value": line})
            return
        headers = {"If-Match": current.headers.get("ETag", "")}
        self.call("memory_edit", "PATCH", path, json={"value": line, "reason": "soak"}, headers=headers)

    def import_transcript(self) -> None:
        exported = self.call("export", "GET", f"/api/v1/conversations/{self.conversation}/transcript.jsonl")
        if exported is None or exported.status_code != 200:
            return
        lines = exported.text.splitlines()[:41]  # the header and up to 40 messages
        self.call(
            "import",
            "POST",
            "/api/v1/conversations/import",
            content="\n".join(lines).encode(),
            headers={"Content-Type": "application/x-ndjson"},
        )

    def document(self) -> None:
        text = "\n\n".join(sentence(self.rng) for _ in range(self.rng.randint(5, 30)))
        files = {"file": (f"notes-{self.n}-{self.rng.randint(0, 10**6)}.md", text.encode(), "text/markdown")}
        self.call("document", "POST", "/api/v1/documents", files=files, data={"end_user": self.user})


def names_accepted(url: str, key: str) -> bool:
    """One probe append with a speaker name: a server without the field refuses it as an unknown field."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    conversation = httpx.post(f"{url}/api/v1/conversations", json={}, headers=headers, timeout=30).json()[
        "id"
    ]
    probe = {"role": "user", "content": "probe", "name": "probe"}
    answer = httpx.post(f"{url}/api/v1/conversations/{conversation}/messages", json=probe, headers=headers)
    httpx.delete(f"{url}/api/v1/conversations/{conversation}", headers=headers, timeout=30)
    if answer.status_code == 400 and "unknown_field" in answer.text:
        return False
    if answer.status_code not in (200, 201):
        raise SystemExit(f"the probe append failed: {answer.status_code} {answer.text[:300]}")
    return True


def warm_up(url: str, key: str) -> None:
    """Before the clock starts: one message embedded in the background and one context call, so the model
    is loaded where it runs (the worker, the server) and a fresh var dir's int8 model is built. A user's
    server has done this long before."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    base = f"{url}/api/v1/conversations"
    conversation = httpx.post(base, json={}, headers=headers, timeout=60).json()["id"]
    probe = {"role": "user", "content": "The staging ledger listens on port 23456."}
    httpx.post(f"{base}/{conversation}/messages", json=probe, headers=headers, timeout=60)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        index = httpx.get(f"{base}/{conversation}", headers=headers, timeout=60).json()["retrieval_index"]
        if index["embedded"] >= 1:
            break
        time.sleep(0.5)
    question = {"user_message": "Which port does the ledger use?", "token_budget": 2000}
    httpx.post(f"{base}/{conversation}/context", json=question, headers=headers, timeout=120)
    httpx.delete(f"{base}/{conversation}", headers=headers, timeout=60)


# --- one run ------------------------------------------------------------------------------------------------


@dataclass
class Samples:
    started: float
    backlog: list[tuple[float, int]] = field(default_factory=list)
    rss: list[tuple[float, float, float]] = field(default_factory=list)  # (t, server MB, workers MB)


def sample(stack: Stack, store: Store, samples: Samples, stop: threading.Event, every: float = 5.0) -> None:
    while not stop.wait(every):
        t = time.monotonic() - samples.started
        with contextlib.suppress(Exception):  # a busy SQLite file: the next sample
            samples.backlog.append((t, store.backlog()))
        samples.rss.append((t, stack.server_rss(), stack.workers_rss()))


def drain(stack: Stack, store: Store, samples: Samples, limit: float = 300.0) -> float | None:
    """Seconds from the end of the load until every stored message has its vectors (None: not within
    `limit`)."""
    ended = time.monotonic()
    while time.monotonic() - ended < limit:
        backlog = store.backlog()
        samples.backlog.append((time.monotonic() - samples.started, backlog))
        if backlog == 0:
            return time.monotonic() - ended
        if len(samples.backlog) % 20 == 0:
            log(f"  {backlog} messages without vectors")
        time.sleep(0.5)
    return None


def queued_tasks(stack: Stack) -> int | str:
    """Task messages still waiting on the broker (Celery's default queue), after the drain."""
    redis_url = stack.env.get("REDIS_URL")
    if not redis_url:
        return "n/a (embedded)"
    import redis

    return int(redis.Redis.from_url(redis_url).llen("celery"))


def agent_caught_up(shared: Shared) -> str:
    """Conversations whose memory agent has read every completed exchange (a short wait for the last run)."""
    import httpx

    headers = {"Authorization": f"Bearer {shared.key}"}
    deadline = time.monotonic() + 60
    while True:
        pending = [
            c
            for c in shared.conversations
            if httpx.get(f"{shared.url}/api/v1/conversations/{c}/memory-agent", headers=headers, timeout=30)
            .json()
            .get("pending")
        ]
        if not pending or time.monotonic() > deadline:
            return f"{len(shared.conversations) - len(pending)} of {len(shared.conversations)}"
        time.sleep(2)


def run(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    log(f"{stack.name}: starting on port {stack.port}")
    stack.start()
    store = Store(stack)
    try:
        warm_up(stack.url, stack.key)
        names = names_accepted(stack.url, stack.key)
        seconds = args.minutes * 60
        shared = Shared(stack.url, stack.key, time.monotonic() + seconds, args.clients / args.rate, names)
        if args.appends_only:
            shared.actions = {"append": 1}
        samples = Samples(started=time.monotonic())
        samples.rss.append((0.0, stack.server_rss(), stack.workers_rss()))
        stop = threading.Event()
        sampler = threading.Thread(target=sample, args=(stack, store, samples, stop), daemon=True)
        sampler.start()
        clients = [threading.Thread(target=Client(shared, n).run) for n in range(args.clients)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        log(f"{stack.name}: load stopped after {time.monotonic() - samples.started:.0f} s; draining")
        load_average = os.getloadavg()[1]  # the machine's, other users' work included
        samples.rss.append((time.monotonic() - samples.started, stack.server_rss(), stack.workers_rss()))
        stop.set()
        drained = drain(stack, store, samples)
        return {
            "stack": stack,
            "seconds": seconds,
            "load_average": load_average,
            "shared": shared,
            "samples": samples,
            "drained": drained,
            "queued": queued_tasks(stack),
            "agent": agent_caught_up(shared),
            "stored": store.messages(),
            "vectors": store.vector_times(),
        }
    finally:
        stack.stop()


# --- the report ---------------------------------------------------------------------------------------------


def seq_gaps(stored: dict[str, tuple[str, int]]) -> int:
    by_conversation: dict[str, list[int]] = defaultdict(list)
    for conversation, seq in stored.values():
        by_conversation[conversation].append(seq)
    return sum(max(seqs) - len(seqs) for seqs in by_conversation.values())


def rss_growth(samples: Samples, seconds: float) -> tuple[float, float, float, float]:
    """Server MB (with its embedded worker) at start, after the warm-up of the load (minute 2; a quarter of
    a shorter run), at the end of the load, and the growth from the warm-up to the end in percent."""
    start = samples.rss[0][1]
    warm = min(120.0, seconds / 4)
    at_warm = next((mb for t, mb, _w in samples.rss if t >= warm), start)
    end = samples.rss[-1][1]
    return start, at_warm, end, (end - at_warm) / at_warm * 100 if at_warm else 0.0


def latency_table(records: list[Record]) -> str:
    by_endpoint: dict[str, list[float]] = defaultdict(list)
    for record in records:
        by_endpoint[record.endpoint].append(record.ms)
    rows = [
        [name, str(len(ms)), f"{percentile(ms, 50):.1f}", f"{percentile(ms, 99):.1f}"]
        for name, ms in sorted(by_endpoint.items())
    ]
    return render_table(["endpoint", "requests", "p50 ms", "p99 ms"], rows)


def backlog_line(samples: Samples) -> str:
    points = samples.backlog[:: max(1, len(samples.backlog) // 16)] + samples.backlog[-1:]
    return ", ".join(f"{t:.0f}s:{n}" for t, n in points)


def summary(result: dict[str, Any]) -> list[list[str]]:
    shared, samples, stored = result["shared"], result["samples"], result["stored"]
    statuses = Counter(r.status for r in shared.records)
    missing = [m for m in shared.acked if m not in stored]
    lags = [max(0.0, result["vectors"][m] - t) for m, t in shared.acked.items() if m in result["vectors"]]
    start, at_warm, end, growth = rss_growth(samples, result["seconds"])
    context = [r.ms for r in shared.records if r.endpoint.startswith("context")]
    drained = result["drained"]
    failed = sum(n for s, n in statuses.items() if s >= 500 or s == 0)
    html = sum(r.html and r.status >= 400 for r in shared.records)
    names = "yes" if shared.names else "no (the server refused `name`: unknown field)"
    lag = f"{percentile(lags, 50):.1f} s / {percentile(lags, 99):.1f} s"
    context_ms = f"{percentile(context, 50):.1f} ms / {percentile(context, 99):.1f} ms"
    return [
        ["requests by status", ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items()))],
        ["responses >= 500 (and failed connections)", str(failed)],
        ["HTML error bodies", str(html)],
        ["messages acknowledged / stored / missing", f"{len(shared.acked)} / {len(stored)} / {len(missing)}"],
        ["seq gaps", str(seq_gaps(stored))],
        ["speaker names sent", names],
        ["embedding lag p50 / p99 (append -> vector)", lag],
        ["backlog drained after the load", "not within 300 s" if drained is None else f"{drained:.1f} s"],
        ["tasks left queued", str(result["queued"])],
        ["memory agent caught up", result["agent"]],
        ["context p50 / p99 (all budgets)", context_ms],
        ["server RSS start / warm / end", f"{start:.0f} / {at_warm:.0f} / {end:.0f} MB ({growth:+.1f} %)"],
        ["machine load average (5 min) at the end of the load", f"{result['load_average']:.1f}"],
        ["Celery workers RSS start / end", f"{samples.rss[0][2]:.0f} / {samples.rss[-1][2]:.0f} MB"],
    ]


def report(result: dict[str, Any]) -> str:
    shared, samples = result["shared"], result["samples"]
    parts = [
        f"## {result['stack'].name}",
        render_table(["figure", "value"], summary(result)),
        latency_table(shared.records),
        f"backlog over time (s:messages without vectors): {backlog_line(samples)}",
    ]
    if shared.errors:
        parts.append("first errors:\n" + "\n".join(f"  {e}" for e in shared.errors[:10]))
    return "\n\n".join(parts)


# --- embedding throughput with one and two Celery workers ---------------------------------------------------


def ingest(stack: Stack, conversations: int, per_conversation: int) -> int:
    """Messages appended in batches while no worker runs: their vector tasks wait on the broker."""
    import httpx

    rng = random.Random(7)
    headers = {"Authorization": f"Bearer {stack.key}"}
    base = f"{stack.url}/api/v1/conversations"
    with httpx.Client(headers=headers, timeout=120) as http:
        for _ in range(conversations):
            conversation = http.post(base, json={}).json()["id"]
            for start in range(0, per_conversation, 50):
                items = [
                    {"role": "user", "content": sentence(rng)}
                    for _ in range(min(50, per_conversation - start))
                ]
                http.post(f"{base}/{conversation}/messages", json={"messages": items}).raise_for_status()
    return conversations * per_conversation


def drain_rate(args: argparse.Namespace, upstream: str, port: int, workers: int) -> tuple[int, float]:
    """Vectors per second once `workers` workers start on a backlog, counted from the tenth percentile of the
    vectors' write times to the last: the workers start one after another (each loads the model on its first
    task), and the first tenth is written before the last of them has begun."""
    with tempfile.TemporaryDirectory(prefix="mnemo-soak-throughput-") as scratch:
        stack = distributed_stack(Path(scratch), upstream, port, args.database_url, args.redis_url, 0)
        stack.start()
        try:
            count = ingest(stack, args.clients, 300)
            store = Store(stack)
            stack.workers_start(workers)
            deadline = time.monotonic() + 900
            while store.backlog() and time.monotonic() < deadline:
                time.sleep(1)
            times = sorted(store.vector_times().values())
        finally:
            stack.stop()
    first = len(times) // 10
    return count, (len(times) - first) / (times[-1] - times[first]) if len(times) > first + 1 else 0.0


def throughput_report(args: argparse.Namespace, upstream: str, port: int) -> str:
    rows, rates = [], []
    for workers in (1, 2):
        log(f"throughput: {workers} worker(s)")
        count, rate = drain_rate(args, upstream, free_port(port), workers)
        rates.append(rate)
        ratio = f"{rate / rates[0]:.2f}x" if rates[0] else "n/a"
        rows.append([str(workers), str(count), f"{rate:.1f}", ratio, f"{os.getloadavg()[0]:.1f}"])
    return "## Embedding throughput, Celery workers\n\n" + render_table(
        ["workers", "messages", "vectors/s", "vs 1 worker", "load average after"], rows
    )


def upstream_start(port: int) -> Any:
    """The fake OpenAI-compatible upstream (tests/llm_server.py) on a port of ours."""
    from tests.llm_server import LLMServer, _Server

    upstream = LLMServer()
    handler = upstream.httpd.RequestHandlerClass
    upstream.httpd.server_close()
    upstream.httpd = _Server((HOST, port), handler)
    upstream.httpd.daemon_threads = True
    upstream.thread = threading.Thread(target=upstream.httpd.serve_forever, kwargs={"poll_interval": 0.05})
    upstream.thread.daemon = True
    upstream.thread.start()
    upstream.reply = "Noted: the export runs nightly and the ledger listens on port 23456."
    return upstream


def main() -> None:
    import signal

    # A soak stopped from outside (timeout, ^C) still stops its servers: the finally clauses run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--short", action="store_true", help="2 minutes per configuration")
    parser.add_argument("--only", choices=["embedded", "distributed"])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second, all clients together")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/mnemo_soak")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--workers", type=int, default=1, help="Celery workers of the distributed run")
    parser.add_argument("--appends-only", action="store_true", help="sustained ingest: single appends only")
    parser.add_argument(
        "--throughput", action="store_true", help="embedding throughput of 1 and 2 Celery workers, then stop"
    )
    args = parser.parse_args()
    if args.short:
        args.minutes = 2.0
    upstream_port = free_port(args.port)
    upstream = upstream_start(upstream_port)
    header = [
        f"{args.clients} clients, {args.rate:g} requests/s together, {args.minutes:g} min per configuration"
        if not args.throughput
        else f"{args.clients} conversations of 300 messages appended, then 1 or 2 Celery workers started"
    ]
    print(machine_header("bench/soak.py", *header), flush=True)
    if args.throughput:
        print("\n" + throughput_report(args, upstream.base_url, upstream_port + 1) + "\n", flush=True)
        upstream.httpd.shutdown()
        return
    for which in ["embedded", "distributed"]:
        if args.only and args.only != which:
            continue
        with tempfile.TemporaryDirectory(prefix=f"mnemo-soak-{which}-") as scratch:
            port = free_port(upstream_port + 1)
            if which == "embedded":
                stack = embedded_stack(Path(scratch), upstream.base_url, port)
            else:
                stack = distributed_stack(
                    Path(scratch), upstream.base_url, port, args.database_url, args.redis_url, args.workers
                )
            print("\n" + report(run(stack, args)) + "\n", flush=True)
    upstream.httpd.shutdown()


if __name__ == "__main__":
    main()
