"""The load generator: a lean HTTP/1.1 client over asyncio streams, the jobs it sends and what it measured.

The load generator shares the cores with the server and the database, so it speaks HTTP/1.1 over raw asyncio
streams, at a small fraction of what a request through httpx costs it.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import secrets
import time
from dataclasses import dataclass, field

from bench._append.cpu import CORES, CpuShare, CpuSnapshot
from bench._append.text import chat_message
from bench._server import HOST

REPLAY_RATE = 0.02


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


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # optional: the plain asyncio loop serves when it is not installed
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
