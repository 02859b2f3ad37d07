"""Append throughput over real HTTP, and token counting speed, each against a baseline from the same run.

1. Messages appended per second (POST /api/v1/conversations/{id}/messages with an Idempotency-Key, ~2 %
   replayed) against granian serving config.wsgi:application (the production layout: WSGI workers for
   the API, a uvicorn beside them for the sockets) and uvicorn serving config.asgi:application (API and
   sockets in one process, as `make run`), on a throwaway PostgreSQL database and on SQLite, with 1 and
   2 server workers. Baseline: the authenticated read GET /api/v1/conversations/{id} at
   the same concurrency against the same server. Afterwards the database must hold exactly one message
   per distinct key, numbered 1..n without a gap in every conversation.
2. Messages and tokens counted per second by providers.tokens.count_message over mixed prose, code and
   Chinese. Baseline: raw tiktoken encode_ordinary over the same corpus.

Run from the repository root:  .venv/bin/python bench/append.py   (or: make bench-append)
Options: --quick (smoke run), --only pg|sqlite|tokens, --redis (also PostgreSQL with REDIS_URL), -n, -c, -k,
--workers 1,2, --servers granian,uvicorn. Everything it starts (servers, the database, temp dirs) is removed
at the end, also on error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import resource
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
HOST = "127.0.0.1"
TARGET_PG_APPENDS_PER_S = 400
REPLAY_RATE = 0.02
CORES = len(os.sched_getaffinity(0))
# granian runs the WSGI app on this many threads per worker, as uvicorn does on MNEMO_HTTP_THREADS (default
# 4): the views hold the GIL most of the time, and 4 threads served more appends than 8.
GRANIAN_THREADS = 4


def log(message: str) -> None:
    # Progress goes to stderr so stdout carries only the table.
    print(message, file=sys.stderr, flush=True)


# --- realistic text ------------------------------------------------------------------------------------

PROSE = [
    "Can you check why the nightly export failed again?",
    "The job stopped after the third batch with a timeout from the storage service.",
    "I looked at the logs and the retry policy gave up after five attempts.",
    "Let me summarise what we know so far before we change anything.",
    "The customer wants the report by Friday, so we should keep the fix small.",
    "Here is the plan: reproduce the failure locally, add a test, then patch the client.",
    "The connection pool was exhausted because every worker opened its own session.",
    "That explains the spikes in latency we saw on Tuesday afternoon.",
    "Please keep the answer short and list the steps in order.",
    "I would rather not touch the database schema in the same change.",
    "The migration adds a nullable column first and backfills it in a second step.",
    "Our agent keeps the last twenty turns and a summary of everything older.",
    "When the context grows past the budget, the oldest turns are compacted into a summary.",
    "Could you draft an email to the team explaining the outage in plain language?",
    "The root cause was a configuration change that doubled the number of open files.",
    "We rolled back at 14:05 and the error rate returned to normal within minutes.",
    "I am not sure the cache is invalidated when a tenant changes its default model.",
    "Good question; the cache key includes the model name, so a change misses the old entry.",
    "Thanks, that works. Now the tests pass on both PostgreSQL and SQLite.",
    "Next, I would like to measure how many messages per second the service can store.",
    "The benchmark should run with one command and print a table we can paste into the README.",
    "Make sure the numbers are compared with a baseline measured in the same run.",
    "The dashboard shows p99 latency, which matters more than the average for our users.",
    "It looks like the slow requests all touch the same conversation at once.",
    "A row lock on the conversation serialises the writers, which is what keeps the order strict.",
    "Let me know if you want me to open a ticket for the follow-up work.",
    "I searched the documentation but could not find how the idempotency key is scoped.",
    "The key is unique per conversation, so a retry of the same request returns the original message.",
    "Sure. I will start with the failing case and then widen the test to cover batches.",
    "The product team asked whether we can keep transcripts for ninety days by default.",
    "That depends on the tenant's retention setting, which overrides the default.",
    "Remember that the summary must never drop a decision the user made earlier.",
    "I will read the design document again and come back with questions tomorrow.",
    "The model answered in French although the user wrote in English; we should pin the language.",
    "Could you rewrite this paragraph so a new engineer understands it on the first read?",
    "We can ship the change behind a flag and turn it on for one tenant first.",
]

CODE = [
    "def retry(fn, attempts=5, delay=0.5):\n    for i in range(attempts):\n        try:\n"
    "            return fn()\n        except TimeoutError:\n            time.sleep(delay * 2**i)\n"
    "    raise RuntimeError('gave up')",
    "SELECT c.id, count(m.id) AS n\nFROM conversations_conversation c\n"
    "JOIN conversations_message m ON m.conversation_id = c.id\nGROUP BY c.id\nORDER BY n DESC\nLIMIT 10;",
    "const res = await fetch(`/api/v1/conversations/${id}/messages`, {\n  method: 'POST',\n"
    "  headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key },\n"
    "  body: JSON.stringify({ role: 'user', content }),\n});\n"
    "if (!res.ok) throw new Error(await res.text());",
    "class Pool:\n    def __init__(self, size: int) -> None:\n        self._free = list(range(size))\n\n"
    "    def acquire(self) -> int:\n        if not self._free:\n"
    "            raise LookupError('pool exhausted')\n"
    "        return self._free.pop()",
    "$ kubectl logs deploy/export-worker --since=1h | grep -c Timeout\n42\n"
    "$ kubectl rollout undo deploy/export-worker",
    "for (const msg of history.slice(-20)) {\n  tokens += countTokens(msg.content) + 3;\n}\n"
    "if (tokens > budget) compact(history);",
]

CHINESE = [
    "请帮我看一下为什么昨晚的导出任务又失败了。",
    "日志显示第三批数据之后存储服务超时，重试五次后放弃。",
    "我们应该先在本地复现这个问题，再写一个测试。",
    "客户希望周五之前拿到报告，所以修改要尽量小。",
    "连接池被耗尽了，因为每个进程都打开了自己的会话。",
    "上下文超过预算时，最早的对话轮次会被压缩成摘要。",
    "摘要绝不能丢掉用户之前做出的决定。",
    "请用简单的语言给团队写一封说明这次故障的邮件。",
    "回滚之后，错误率在几分钟内恢复正常。",
    "这个幂等键在每个会话内唯一，重试会返回原来的消息。",
    "好的，我先处理失败的情况，然后把测试扩展到批量请求。",
    "模型用法语回答了英文问题，我们需要固定输出语言。",
]


def words_of_prose(rng: random.Random, n_words: int) -> str:
    words: list[str] = []
    while len(words) < n_words:
        words.extend(rng.choice(PROSE).split())
    return " ".join(words[:n_words])


def chat_message(rng: random.Random, role: str) -> str:
    """A user or assistant message of 20-200 words; an assistant answer sometimes carries a code block."""
    n_words = rng.randint(20, 200)
    if role == "assistant" and n_words > 60 and rng.random() < 0.3:
        code = rng.choice(CODE)
        prose_words = max(20, n_words - len(code.split()))
        return f"{words_of_prose(rng, prose_words)}\n\n```\n{code}\n```"
    return words_of_prose(rng, n_words)


def token_corpus(rng: random.Random, size: int) -> list[tuple[str, str]]:
    """(role, content) pairs: mostly English prose, a quarter with code, some Chinese and some mixed."""
    corpus = []
    for i in range(size):
        role = "user" if i % 2 == 0 else "assistant"
        pick = rng.random()
        if pick < 0.55:
            content = words_of_prose(rng, rng.randint(20, 300))
        elif pick < 0.80:
            content = f"{words_of_prose(rng, rng.randint(10, 80))}\n\n```\n{rng.choice(CODE)}\n```"
        elif pick < 0.95:
            content = "".join(rng.choice(CHINESE) for _ in range(rng.randint(2, 20)))
        else:
            content = f"{''.join(rng.choice(CHINESE) for _ in range(3))} {words_of_prose(rng, 40)}"
        corpus.append((role, content))
    return corpus


# --- a lean HTTP/1.1 client --------------------------------------------------------------------------------
# The load generator shares the two cores with the server and the database, so it speaks HTTP/1.1 over
# raw asyncio streams (a few tens of microseconds per request) rather than through httpx (several hundred).


class HttpConnection:
    """One keep-alive connection; requests go one at a time."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(HOST, self.port)
        reader = self.reader
        assert reader is not None
        try:
            self.writer.write(head + body)
            status_line = await reader.readline()
            if not status_line:
                raise ConnectionError("the server closed the connection")
            status = int(status_line.split(b" ", 2)[1])
            length, chunked, close = None, False, False
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding":
                    chunked = b"chunked" in value.lower()
                elif name == b"connection":
                    close = b"close" in value.lower()
            if chunked:
                chunks = []
                while size := int((await reader.readline()).split(b";")[0], 16):
                    chunks.append(await reader.readexactly(size))
                    await reader.readline()
                await reader.readline()
                payload = b"".join(chunks)
            elif length is not None:
                payload = await reader.readexactly(length)
            else:
                payload = await reader.read()
                close = True
        except BaseException:
            self.close()
            raise
        if close:
            self.close()
        return status, payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def request_head(method: str, path: str, api_key: str, port: int, body: bytes, extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nAuthorization: Bearer {api_key}\r\n{extra}"
    if body or method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode()


@dataclass
class Job:
    head: bytes
    body: bytes = b""
    replay: bool = False  # send again with the same key after the first answer


@dataclass
class PhaseResult:
    requests: int = 0  # answered, whatever the status (replays not included)
    ok: int = 0  # answered with the expected status
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    replays: int = 0
    replays_ok: int = 0
    cpu: CpuShare | None = None

    def note_error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(text[:300])

    @property
    def server_ms_per_request(self) -> float:
        # Replays are requests the server answered too.
        return self.cpu.server / max(1, self.requests + self.replays) * 1e3 if self.cpu else float("nan")

    @property
    def ceiling(self) -> float:
        """Requests/s the cores could serve if the server and PostgreSQL had them to themselves: a figure
        that other jobs on the machine disturb far less than the measured rate."""
        if not self.cpu:
            return float("nan")
        per_request = (self.cpu.server + self.cpu.postgres) / max(1, self.requests + self.replays)
        return CORES / per_request if per_request else float("nan")

    @property
    def rate(self) -> float:
        # Successful first attempts per second; the time the replays took is in the denominator.
        return self.ok / self.seconds if self.seconds else 0.0

    def percentile(self, p: float) -> float:
        if not self.latencies:
            return float("nan")
        # Nearest rank: a latency that was actually measured, never an interpolation.
        ordered = sorted(self.latencies)
        return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


async def run_jobs(
    port: int, jobs: list[Job], concurrency: int, expect: int, server_pids: list[int]
) -> PhaseResult:
    """Send the jobs from `concurrency` clients, each on its own keep-alive connection."""
    result = PhaseResult()
    connections = [HttpConnection(port) for _ in range(concurrency)]
    # Connect before the clock starts (a worker accepts each connection and keeps it: with 2 workers the
    # kernel spreads them between the two).
    await asyncio.gather(*(c.request(*_ping(jobs[0])) for c in connections))
    pending = iter(jobs)

    async def client(conn: HttpConnection) -> None:
        for job in pending:
            started = time.perf_counter()
            try:
                status, payload = await conn.request(job.head, job.body)
            except Exception as exc:
                result.note_error(f"{type(exc).__name__}: {exc}")
                continue
            result.latencies.append(time.perf_counter() - started)
            result.requests += 1
            if status != expect:
                result.note_error(f"HTTP {status}: {payload[:200]!r}")
                continue
            result.ok += 1
            if job.replay:
                result.replays += 1
                try:
                    again, replayed = await conn.request(job.head, job.body)
                except Exception as exc:
                    result.note_error(f"replay {type(exc).__name__}: {exc}")
                    continue
                if again == 200 and json.loads(replayed)["id"] == json.loads(payload)["id"]:
                    result.replays_ok += 1
                else:
                    result.note_error(f"replay answered HTTP {again}: {replayed[:200]!r}")

    before = CpuSnapshot.take(server_pids)
    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in connections))
    result.seconds = time.perf_counter() - started
    result.cpu = CpuSnapshot.take(server_pids).since(before)
    for conn in connections:
        conn.close()
    return result


def _ping(job: Job) -> tuple[bytes, bytes]:
    """The cheapest authenticated request, with the job's credentials, to open a connection."""
    auth = [line for line in job.head.split(b"\r\n") if line.startswith((b"Authorization:", b"Host:"))]
    return b"GET /api/v1/conversations?limit=1 HTTP/1.1\r\n" + b"\r\n".join(auth) + b"\r\n\r\n", b""


# --- CPU accounting from /proc -----------------------------------------------------------------------------
# Other people's jobs may share the machine; splitting the cores' time between the server, PostgreSQL, this
# load generator and everything else shows whether a figure was taken on a quiet machine.

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class CpuShare:
    """CPU seconds spent during a phase, by whom, and the wall time of all cores together."""

    server: float
    postgres: float
    client: float
    other: float
    capacity: float  # cores x seconds

    def postgres_is_other(self) -> None:
        """On SQLite the database runs inside the server; PostgreSQL busy meanwhile is someone else's."""
        self.other += self.postgres
        self.postgres = 0.0

    def split(self) -> str:
        idle = max(0.0, self.capacity - self.server - self.postgres - self.client - self.other)
        parts = [
            ("server", self.server),
            ("pg", self.postgres),
            ("client", self.client),
            ("other", self.other),
        ]
        return " ".join(f"{name} {value / self.capacity:.0%}" for name, value in [*parts, ("idle", idle)])


@dataclass
class CpuSnapshot:
    server: dict[int, float]  # pid -> CPU seconds so far
    postgres: dict[int, float]
    client: float
    busy: float
    total: float

    @classmethod
    def take(cls, server_pids: list[int]) -> CpuSnapshot:
        processes: dict[int, tuple[int, str, float]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                raw = (entry / "stat").read_text()
            except OSError:
                continue
            name = raw[raw.index("(") + 1 : raw.rindex(")")]
            fields = raw.rsplit(")", 1)[1].split()
            processes[int(entry.name)] = (
                int(fields[1]),
                name,
                (int(fields[11]) + int(fields[12])) / CLOCK_TICKS,
            )
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in processes.items():
            children.setdefault(ppid, []).append(pid)
        server, todo = {}, list(server_pids)
        while todo:
            pid = todo.pop()
            if pid in processes:
                server[pid] = processes[pid][2]
            todo.extend(children.get(pid, []))
        postgres = {pid: cpu for pid, (_, name, cpu) in processes.items() if name == "postgres"}
        usage = resource.getrusage(resource.RUSAGE_SELF)
        # The first line of /proc/stat sums every core: user nice system idle iowait irq softirq steal.
        jiffies = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
        total = sum(jiffies) / CLOCK_TICKS
        busy = total - (jiffies[3] + jiffies[4]) / CLOCK_TICKS
        return cls(server, postgres, usage.ru_utime + usage.ru_stime, busy, total)

    def since(self, before: CpuSnapshot) -> CpuShare:
        # Per process, so a backend that exited meanwhile (someone else's) does not count negative.
        def delta(now: dict[int, float], then: dict[int, float]) -> float:
            return sum(cpu - then.get(pid, 0.0) for pid, cpu in now.items())

        server, postgres = delta(self.server, before.server), delta(self.postgres, before.postgres)
        client = self.client - before.client
        other = max(0.0, (self.busy - before.busy) - server - postgres - client)
        return CpuShare(server, postgres, client, other, self.total - before.total)


# --- databases ------------------------------------------------------------------------------------------


@dataclass
class Backend:
    label: str
    env: dict[str, str]
    var_dir: Path
    database_url: str = ""  # empty for SQLite


@contextlib.contextmanager
def postgres_database(pg_url: str) -> Iterator[str]:
    """A fresh, empty database; dropped afterwards whatever happened."""
    import psycopg

    base = pg_url.rsplit("/", 1)[0]
    name = f"mnemo_bench_{os.getpid()}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        log(f"dropped database {name}")


def server_version(pg_url: str) -> str:
    import psycopg

    with psycopg.connect(pg_url) as conn:
        return str(conn.execute("SHOW server_version").fetchone()[0]).split()[0]


def server_env(var_dir: Path, database_url: str, redis_url: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(
        DJANGO_SETTINGS_MODULE="config.django.local",
        DJANGO_DEBUG="false",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_ALLOWED_HOSTS=HOST,
        MNEMO_VAR_DIR=str(var_dir),
        PYTHONDONTWRITEBYTECODE="1",
    )
    if database_url:
        env["DATABASE_URL"] = database_url
    if redis_url:
        env["REDIS_URL"] = redis_url
    return env


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def prepare(backend: Backend) -> str:
    """Migrate and create the bench tenant; returns its API key."""
    started = time.perf_counter()
    manage(backend.env, "migrate", "--noinput")
    created = json.loads(manage(backend.env, "create_tenant", "bench", "--json").strip().splitlines()[-1])
    log(f"[{backend.label}] migrated and created a tenant in {time.perf_counter() - started:.1f}s")
    return created["api_key"]


def verify(backend: Backend, conversation_ids: list[str], keys: set[str]) -> tuple[bool, str]:
    """Messages stored = distinct keys sent, no key twice, every conversation numbered 1..n without a gap."""
    if backend.database_url:
        import psycopg

        with psycopg.connect(backend.database_url) as conn:
            rows = conn.execute(
                "SELECT conversation_id::text, seq, idempotency_key FROM conversations_message "
                "WHERE conversation_id = ANY(%s::uuid[])",
                (conversation_ids,),
            ).fetchall()
            last = dict(
                conn.execute(
                    "SELECT id::text, last_seq FROM conversations_conversation WHERE id = ANY(%s::uuid[])",
                    (conversation_ids,),
                ).fetchall()
            )
    else:
        # Django keeps UUIDs as 32 hex digits in SQLite.
        hex_ids = [c.replace("-", "") for c in conversation_ids]
        marks = ",".join("?" * len(hex_ids))
        with contextlib.closing(sqlite3.connect(backend.var_dir / "db.sqlite3")) as conn:
            rows = conn.execute(
                "SELECT conversation_id, seq, idempotency_key FROM conversations_message "
                f"WHERE conversation_id IN ({marks})",
                hex_ids,
            ).fetchall()
            last = dict(
                conn.execute(
                    f"SELECT id, last_seq FROM conversations_conversation WHERE id IN ({marks})", hex_ids
                )
            )
    stored_keys = [row[2] for row in rows]
    problems = []
    if len(rows) != len(keys):
        problems.append(f"{len(rows)} messages for {len(keys)} distinct keys")
    if len(set(stored_keys)) != len(stored_keys):
        problems.append(f"{len(stored_keys) - len(set(stored_keys))} keys stored twice")
    if set(stored_keys) != keys:
        problems.append(
            f"{len(keys - set(stored_keys))} keys missing, {len(set(stored_keys) - keys)} unexpected"
        )
    seqs: dict[str, list[int]] = {}
    for conversation_id, seq, _ in rows:
        seqs.setdefault(str(conversation_id), []).append(seq)
    gapped = [c for c, s in seqs.items() if sorted(s) != list(range(1, len(s) + 1)) or last.get(c) != len(s)]
    if gapped:
        problems.append(f"{len(gapped)} conversations with a gap, a duplicate or a stale last_seq")
    if problems:
        return False, "; ".join(problems)
    return True, f"{len(rows)} msgs = {len(keys)} keys, {len(seqs)} convs gapless 1..n"


# --- the server ----------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def server_command(server: str, workers: int, port: int) -> list[str]:
    """The two ways the README gives to serve the API: uvicorn on config.asgi (API and WebSockets in one
    process: `make run`), or granian's WSGI workers on config.wsgi for the API beside a uvicorn for the
    sockets (the production layout, docs/operations.md "Deploying")."""
    if server == "granian":
        return [
            str(Path(PYTHON).parent / "granian"), "--interface", "wsgi", "config.wsgi:application",
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
    with open(log_path, "wb") as log_file:
        # A session of its own, so the workers can be killed with their supervisor if it does not stop.
        proc = subprocess.Popen(
            server_command(server, workers, port),
            cwd=REPO,
            env=backend.env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
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


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # The supervisor is gone; make sure no worker of its session outlived it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


# --- one measurement: a server, its warm-up, the read baseline and the appends ------------------------------


@dataclass
class AppendRun:
    label: str
    server: str
    workers: int
    gets: PhaseResult
    appends: PhaseResult
    verified: bool
    verify_note: str


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def append_jobs(
    rng: random.Random,
    conversations: list[str],
    count: int,
    api_key: str,
    port: int,
    tag: str,
    keys: set[str],
) -> list[Job]:
    """Bodies are built before the clock starts, so the timed loop only sends and reads."""
    turns = dict.fromkeys(conversations, 0)
    jobs = []
    for i in range(count):
        conversation_id = rng.choice(conversations)
        role = "user" if turns[conversation_id] % 2 == 0 else "assistant"
        turns[conversation_id] += 1
        key = f"{tag}-{i}-{secrets.token_hex(6)}"
        keys.add(key)
        body = json.dumps({"role": role, "content": chat_message(rng, role)}).encode()
        path = f"/api/v1/conversations/{conversation_id}/messages"
        head = request_head("POST", path, api_key, port, body, extra=f"Idempotency-Key: {key}\r\n")
        jobs.append(Job(head, body, replay=rng.random() < REPLAY_RATE))
    return jobs


def get_jobs(rng: random.Random, conversations: list[str], count: int, api_key: str, port: int) -> list[Job]:
    return [
        Job(request_head("GET", f"/api/v1/conversations/{rng.choice(conversations)}", api_key, port, b""))
        for _ in range(count)
    ]


async def create_conversations(port: int, api_key: str, count: int) -> list[str]:
    conn = HttpConnection(port)
    ids = []
    for i in range(count):
        body = json.dumps({"title": f"bench {i}", "end_user": f"user-{i % 10}"}).encode()
        status, payload = await conn.request(
            request_head("POST", "/api/v1/conversations", api_key, port, body), body
        )
        if status != 201:
            raise RuntimeError(f"creating a conversation answered HTTP {status}: {payload[:300]!r}")
        ids.append(json.loads(payload)["id"])
    conn.close()
    return ids


def measure(backend: Backend, api_key: str, server: str, workers: int, args: argparse.Namespace) -> AppendRun:
    rng = random.Random(f"{args.seed}-{backend.label}-{server}-{workers}")
    tag = f"[{backend.label} {server} w={workers}]"
    keys: set[str] = set()
    with (
        http_server(backend, server, workers, api_key) as (port, proc),
        asyncio.Runner(loop_factory=new_loop) as runner,
    ):

        def phase(jobs: list[Job], expect: int) -> PhaseResult:
            return runner.run(run_jobs(port, jobs, args.concurrency, expect, [proc.pid]))

        conversations = runner.run(create_conversations(port, api_key, args.conversations))
        # The warm-up appends also load the tokenizer in every worker; its keys are verified with the rest.
        warm = phase(append_jobs(rng, conversations, args.warmup, api_key, port, "warm", keys), 201)
        warm_gets = phase(get_jobs(rng, conversations, args.warmup, api_key, port), 200)
        for sample in warm.error_samples + warm_gets.error_samples:
            log(f"{tag} warm-up error: {sample}")
        gets = phase(get_jobs(rng, conversations, args.n, api_key, port), 200)
        appends = phase(append_jobs(rng, conversations, args.n, api_key, port, "run", keys), 201)
    if not backend.database_url:
        for result in (gets, appends):
            if result.cpu:
                result.cpu.postgres_is_other()
    # Errors of the warm-up count too: the target is zero errors over everything sent.
    appends.errors += warm.errors
    gets.errors += warm_gets.errors
    ok, note = verify(backend, conversations, keys)
    replays_ok = appends.replays == appends.replays_ok
    run = AppendRun(backend.label, server, workers, gets, appends, ok and replays_ok, note)
    log(
        f"{tag} {appends.rate:.0f} appends/s (p50 {fmt_ms(appends.percentile(50))}, "
        f"p99 {fmt_ms(appends.percentile(99))}), {gets.rate:.0f} GET/s, "
        f"errors {appends.errors}+{gets.errors}, server CPU {appends.server_ms_per_request:.1f} ms/append; "
        f"cores: {appends.cpu.split() if appends.cpu else '-'}; verify: {note}"
    )
    for sample in appends.error_samples + gets.error_samples:
        log(f"{tag} error: {sample}")
    return run


def run_backend(label: str, args: argparse.Namespace, redis_url: str = "") -> list[AppendRun]:
    with contextlib.ExitStack() as stack:
        var_dir = Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix=f"mnemo-bench-{label.lower()}-"))
        )
        database_url = stack.enter_context(postgres_database(args.pg_url)) if label.startswith("PG") else ""
        backend = Backend(label, server_env(var_dir, database_url, redis_url), var_dir, database_url)
        api_key = prepare(backend)
        return [
            measure(backend, api_key, server, workers, args)
            for server in args.servers
            for workers in args.workers
        ]


# --- token counting ----------------------------------------------------------------------------------------


@dataclass
class TokenRun:
    messages: int
    ours_seconds: float
    ours_tokens: int
    raw_seconds: float
    raw_tokens: int


def bench_tokens(args: argparse.Namespace, scratch: Path) -> TokenRun:
    # providers.tokens fills tiktoken's cache from the shipped vocabularies; point it at a temp dir rather
    # than the repository's var/.
    os.environ.pop("DJANGO_SETTINGS_MODULE", None)
    os.environ["MNEMO_VAR_DIR"] = str(scratch)
    sys.path.insert(0, str(REPO))
    from providers.model_table import model_info
    from providers.tokens import count_message, get_encoding

    model = "gpt-4o"
    encoding = get_encoding(model_info(model).encoding)
    corpus = token_corpus(random.Random(f"{args.seed}-tokens"), args.corpus)
    contents = [content for _, content in corpus]

    def ours() -> int:
        return sum(count_message(role=role, content=content, model=model) for role, content in corpus)

    def raw() -> int:
        return sum(len(encoding.encode_ordinary(content)) for content in contents)

    ours(), raw()  # warm-up: the first encodes build tiktoken's internal caches
    best_ours = best_raw = float("inf")
    ours_tokens = raw_tokens = 0
    # Interleaved rounds, best of each: both sides see the same noise from the machine.
    for _ in range(args.token_rounds):
        started = time.perf_counter()
        raw_tokens = raw()
        best_raw = min(best_raw, time.perf_counter() - started)
        started = time.perf_counter()
        ours_tokens = ours()
        best_ours = min(best_ours, time.perf_counter() - started)
    return TokenRun(len(corpus), best_ours, ours_tokens, best_raw, raw_tokens)


# --- report ---------------------------------------------------------------------------------------------


def header(args: argparse.Namespace, pg_version: str) -> str:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from bench._common import machine_header

    extra = [
        f"load: {args.n} appends and {args.n} GETs per configuration (+{args.warmup} of each to warm up) "
        f"over {args.conversations} conversations from {args.concurrency} keep-alive clients; "
        f"~{REPLAY_RATE:.0%} of appends replayed with the same Idempotency-Key",
    ]
    if pg_version:
        with_redis = args.redis or args.redis_only
        redis = "PG+Redis rows with REDIS_URL, the others without" if with_redis else "no Redis"
        extra.append(f"PostgreSQL {pg_version}; DJANGO_DEBUG=false, {redis}")
    uvicorn_threads = os.environ.get("MNEMO_HTTP_THREADS") or "MNEMO_HTTP_THREADS (default)"
    extra.append(
        f"servers: uvicorn (uvloop, httptools) on config.asgi, requests on {uvicorn_threads} threads; "
        f"granian (WSGI) on config.wsgi, {GRANIAN_THREADS} threads per worker"
    )
    return machine_header("bench/append.py", *extra)


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


TableRow = tuple[str, str, str, str]  # figure, value, baseline, ratio


def table(runs: list[AppendRun], tokens: TokenRun | None) -> list[TableRow]:
    rows = _headline_rows(runs)
    for run in runs:
        rows += _run_rows(run)
    if tokens:
        rows += _token_rows(tokens)
    return rows


def _headline_rows(runs: list[AppendRun]) -> list[TableRow]:
    """The best PostgreSQL row against the target. With or without Redis: with REDIS_URL (the production
    set-up) background work such as the memory agent is queued for Celery workers instead of running eagerly
    inside the request."""
    pg = [r for r in runs if r.label in ("PG", "PG+Redis")]
    if not pg:
        return []
    best = max(pg, key=lambda r: r.appends.rate)
    verdict = "met" if best.appends.rate >= TARGET_PG_APPENDS_PER_S and best.appends.errors == 0 else "MISSED"
    target = f"target ≥{TARGET_PG_APPENDS_PER_S}, 0 errors: {verdict}"
    return [
        (
            f"HEADLINE PG appends/s, best ({best.label} {best.server} w={best.workers}); {target}",
            f"{best.appends.rate:.0f}",
            f"{best.gets.rate:.0f} GET/s",
            f"{best.appends.rate / best.gets.rate:.2f}",
        )
    ]


def _run_rows(run: AppendRun) -> list[TableRow]:
    name = f"{run.label} {run.server} w={run.workers}"
    a, g = run.appends, run.gets
    return [
        (f"{name} appends/s", f"{a.rate:.0f}", f"{g.rate:.0f} GET/s", f"{a.rate / g.rate:.2f}"),
        (
            f"{name} append p50",
            fmt_ms(a.percentile(50)),
            fmt_ms(g.percentile(50)),
            f"{a.percentile(50) / g.percentile(50):.2f}",
        ),
        (
            f"{name} append p99",
            fmt_ms(a.percentile(99)),
            fmt_ms(g.percentile(99)),
            f"{a.percentile(99) / g.percentile(99):.2f}",
        ),
        (
            f"{name} server CPU per request",
            f"{a.server_ms_per_request:.1f} ms",
            f"{g.server_ms_per_request:.1f} ms",
            f"{a.server_ms_per_request / g.server_ms_per_request:.2f}",
        ),
        (
            f"{name} ceiling: {CORES} cores ÷ (server + pg CPU/request)",
            f"{a.ceiling:.0f}/s",
            f"{g.ceiling:.0f}/s",
            f"{a.ceiling / g.ceiling:.2f}",
        ),
        (f"{name} cores' time", a.cpu.split() if a.cpu else "-", g.cpu.split() if g.cpu else "-", "-"),
        (f"{name} errors (incl. warm-up)", str(a.errors), f"{g.errors} (GET)", "-"),
        (f"{name} replays answered 200, same id", f"{a.replays_ok}/{a.replays}", "-", "-"),
        (f"{name} DB check", "ok" if run.verified else "FAILED", run.verify_note, "-"),
    ]


def _token_rows(tokens: TokenRun) -> list[TableRow]:
    ours_mps, raw_mps = tokens.messages / tokens.ours_seconds, tokens.messages / tokens.raw_seconds
    ours_tps, raw_tps = tokens.ours_tokens / tokens.ours_seconds, tokens.raw_tokens / tokens.raw_seconds
    return [
        (
            f"count_message messages/s ({tokens.messages} mixed msgs)",
            f"{ours_mps:,.0f}",
            f"{raw_mps:,.0f} encode_ordinary",
            f"{ours_mps / raw_mps:.2f}",
        ),
        (
            "count_message tokens/s",
            f"{ours_tps:,.0f}",
            f"{raw_tps:,.0f} encode_ordinary",
            f"{ours_tps / raw_tps:.2f}",
        ),
    ]


def render(rows: list[tuple[str, str, str, str]]) -> str:
    rows = [("figure", "value", "baseline", "ratio"), *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |" for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=4000, help="timed appends (and GETs) per configuration")
    parser.add_argument("-c", "--concurrency", type=int, default=16, help="concurrent keep-alive clients")
    parser.add_argument(
        "-k", "--conversations", type=int, default=100, help="conversations the appends spread over"
    )
    parser.add_argument("--workers", default="1,2", help="server worker counts to try, comma-separated")
    parser.add_argument(
        "--servers", default="granian,uvicorn", help="HTTP servers to try, comma-separated: granian, uvicorn"
    )
    parser.add_argument("--warmup", type=int, default=300, help="untimed appends and GETs before each run")
    parser.add_argument("--corpus", type=int, default=3000, help="messages in the token-counting corpus")
    parser.add_argument(
        "--token-rounds", type=int, default=5, help="timed passes over the corpus (best kept)"
    )
    parser.add_argument("--quick", action="store_true", help="small numbers for a smoke run")
    parser.add_argument("--only", choices=["pg", "sqlite", "tokens"])
    parser.add_argument("--redis", action="store_true", help="also measure PostgreSQL with REDIS_URL set")
    parser.add_argument("--redis-only", action="store_true", help="PostgreSQL with REDIS_URL set, only")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--pg-url", default="postgres://postgres@127.0.0.1:5432/postgres", help="admin connection"
    )
    parser.add_argument("--seed", default="mnemo")
    args = parser.parse_args()
    if args.quick:
        args.n, args.warmup, args.corpus, args.token_rounds = 300, 50, 300, 2
        args.conversations = min(args.conversations, 20)
    args.workers = [int(w) for w in args.workers.split(",")]
    args.servers = [s.strip() for s in args.servers.split(",")]
    unknown = set(args.servers) - {"granian", "uvicorn"}
    if unknown:
        parser.error(f"unknown server(s): {', '.join(sorted(unknown))}")
    return args


def main() -> int:
    args = parse_args()
    # A SIGTERM (e.g. from a CI timeout) unwinds like Ctrl-C, so the servers and the database are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: list[AppendRun] = []
    tokens = None
    if args.only in (None, "pg") and not args.redis_only:
        runs += run_backend("PG", args)
    if args.only in (None, "pg") and (args.redis or args.redis_only):
        runs += run_backend("PG+Redis", args, redis_url=args.redis_url)
    if args.only in (None, "sqlite"):
        runs += run_backend("SQLite", args)
    if args.only in (None, "tokens"):
        scratch = Path(tempfile.mkdtemp(prefix="mnemo-bench-tokens-"))
        try:
            tokens = bench_tokens(args, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    pg_version = server_version(args.pg_url) if any(r.label.startswith("PG") for r in runs) else ""
    print(header(args, pg_version))
    print(render(table(runs, tokens)))
    failed = any(r.appends.errors or r.gets.errors or not r.verified for r in runs)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        # The servers, the database and the temp dirs were removed on the way out.
        log("interrupted")
        sys.exit(130)
