"""The chat proxy's overhead: streaming POST /v1/chat/completions through Mnemo against the same request sent
straight to the fake upstream, on a conversation of 10,000 messages, and 50 concurrent streams.

1. Sequential: each round sends one new user turn through the proxy (X-Mnemo-Conversation: the 10k-message
   conversation), then the body the proxy sent upstream straight to the upstream (the baseline). Reported:
   p50 and p95 of the total time and of the time to the first streamed byte, for both, and the proxy's own
   append and context-assembly times (its Server-Timing header).
2. Concurrent: 50 streams at once, each opening a conversation of its own; the errors are counted.

The server is granian (ASGI, --workers 2) on config.asgi:application; the upstream is tests/llm_server.py
(a real HTTP server on 127.0.0.1, streaming server-sent events) in this process. PostgreSQL when reachable
(a throwaway database), else SQLite. Message vectors are off and background tasks are queued, not run, in the
server (a worker's job in a deployment; BENCH_PROXY_EAGER=true runs them there), and the tenant's own
background LLM use is off, so the upstream sees only the proxy's calls.

Run from the repository root:  .venv/bin/python bench/proxy.py   (or: make bench-proxy)
Options: --rounds N (default 100), --messages N (default 10000), --concurrency N (default 50), --sqlite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import REPO, django_setup, log, machine_header, percentile, render_table
from bench.append import free_port, stop

HOST = "127.0.0.1"
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
WORDS = [
    "export", "batch", "timeout", "storage", "retry", "worker", "queue", "invoice", "billing", "deploy",
    "config", "schema", "migration", "index", "latency", "cache", "token", "budget", "summary", "memory",
    "the", "a", "of", "to", "and", "in", "for", "with", "on", "at", "by", "from", "after", "before",
]  # fmt: skip


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def seed(count: int, rng: random.Random) -> tuple[str, str]:
    """A tenant and its conversation of `count` messages written with bulk_create (token counts as the write
    path stores them) and the proxy's chain keys, so each round is a new turn on a long conversation. The
    tenant's own background LLM work is off (llm_enabled false): the upstream then sees only the proxy's
    calls. Returns (api key, conversation id)."""
    from context.proxy.history import chain_keys
    from conversations.models import Conversation, Message
    from conversations.services import conversation_create
    from providers.tokens import count_message
    from tenants.services import tenant_create

    tenant, raw_key = tenant_create(slug="bench-proxy", name="Bench proxy")
    tenant.settings = {**(tenant.settings or {}), "llm_enabled": False}
    tenant.save()
    conversation = conversation_create(tenant=tenant, end_user_external_id="bench", model="gpt-4o")
    items = [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": sentence(rng, rng.randint(12, 60)),
            "parts": [],
        }
        for i in range(count)
    ]
    rows = [
        Message(
            conversation=conversation,
            seq=index + 1,
            role=item["role"],
            content=item["content"],
            token_count=count_message(role=item["role"], content=item["content"], model="gpt-4o"),
            idempotency_key=key,
        )
        for index, (item, key) in enumerate(zip(items, chain_keys(items), strict=True))
    ]
    Message.objects.bulk_create(rows, batch_size=1000)
    Conversation.objects.filter(pk=conversation.pk).update(last_seq=count)
    return raw_key, str(conversation.id)


def analyze() -> None:
    """Fresh planner statistics, as autovacuum gathers them on a table that grew this way (and as
    bench/context_latency.py does). Without them (autovacuum is off on some servers, this machine's
    included) PostgreSQL still takes the seeded table for empty: the proxy's read of the conversation's
    newest message became a bitmap scan and sort of all 10,000 rows, ~3 ms of every append."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def server(env: dict[str, str], workers: int, port: int, log_path: Path) -> subprocess.Popen:
    command = [
        str(Path(sys.executable).parent / "granian"), "--interface", "asginl", "config.asgi:application",
        "--host", HOST, "--port", str(port), "--workers", str(workers), "--no-ws",
        "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
    with open(log_path, "wb") as out:
        return subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def wait_ready(port: int, key: str, proc: subprocess.Popen, log_path: Path) -> None:
    import httpx

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


def timed_stream(client, url: str, body: dict, headers: dict) -> tuple[float, float, dict[str, float], bool]:
    """(seconds to the first body byte, seconds in all, Server-Timing values, whether the stream ended with
    [DONE])."""
    started = time.perf_counter()
    first = None
    tail = b""
    with client.stream("POST", url, json=body, headers=headers) as response:
        for chunk in response.iter_raw():
            if first is None:
                first = time.perf_counter()
            tail = (tail + chunk)[-64:]
        timing = {
            m[0]: float(m[1])
            for m in re.findall(r"mnemo-(\w+);dur=([\d.]+)", response.headers.get("server-timing", ""))
        }
        ok = response.status_code == 200 and b"[DONE]" in tail
    end = time.perf_counter()
    return (first or end) - started, end - started, timing, ok


def sequential(
    port: int, key: str, conversation: str, upstream, rounds: int, rng: random.Random
) -> dict[str, list[float]]:
    import httpx

    series: dict[str, list[float]] = {
        k: []
        for k in (
            "proxy_total",
            "proxy_first",
            "direct_total",
            "direct_first",
            "append",
            "context",
            "upstream",
        )
    }
    proxy_headers = {"Authorization": f"Bearer {key}", "X-Mnemo-Conversation": conversation}
    with httpx.Client(timeout=60) as client:
        for index in range(rounds + 3):  # three warm-up rounds
            body = {
                "model": "gpt-4o",
                "stream": True,
                "messages": [{"role": "user", "content": sentence(rng, 20)}],
            }
            first, total, timing, ok = timed_stream(
                client, f"http://{HOST}:{port}/v1/chat/completions", body, proxy_headers
            )
            if not ok:
                raise RuntimeError("a proxy stream failed")
            sent = next(r["body"] for r in reversed(upstream.requests) if r["body"].get("stream"))
            d_first, d_total, _, d_ok = timed_stream(
                client, f"{upstream.base_url}/chat/completions", sent, {"Authorization": "Bearer k"}
            )
            if not d_ok:
                raise RuntimeError("a direct stream failed")
            if index < 3:
                continue
            series["proxy_first"].append(first)
            series["proxy_total"].append(total)
            series["direct_first"].append(d_first)
            series["direct_total"].append(d_total)
            series["append"].append(timing.get("append", 0) / 1000)
            series["context"].append(timing.get("context", 0) / 1000)
            series["upstream"].append(timing.get("upstream", 0) / 1000)
    return series


def pipeline(conversation_id: str, rounds: int, rng: random.Random) -> list[float]:
    """The context pipeline alone on the same conversation, in this process (no HTTP, no proxy): what
    POST …/context costs, the baseline for the proxy's context time."""
    from context.pipeline import context_assemble
    from context.state import ContextRequest
    from conversations.models import Conversation

    conversation = Conversation.objects.select_related("tenant").get(pk=conversation_id)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        context_assemble(
            conversation=conversation,
            request=ContextRequest(user_message=sentence(rng, 20), model="gpt-4o", format="openai"),
        )
        times.append(time.perf_counter() - started)
    return times


async def concurrent(port: int, key: str, streams: int) -> tuple[int, float]:
    import httpx

    async def one(client: httpx.AsyncClient, index: int) -> bool:
        body = {
            "model": "gpt-4o",
            "stream": True,
            "messages": [{"role": "user", "content": f"stream {index}: hello"}],
        }
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                data = b"".join([chunk async for chunk in response.aiter_raw()])
        except httpx.HTTPError as exc:
            log(f"  stream {index}: {type(exc).__name__}: {exc}")
            return False
        if response.status_code == 200 and b"[DONE]" in data:
            return True
        log(f"  stream {index}: HTTP {response.status_code}: {data[-300:]!r}")
        return False

    limits = httpx.Limits(max_connections=streams)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=f"http://{HOST}:{port}", headers=headers, timeout=120, limits=limits
    ) as client:
        started = time.perf_counter()
        results = await asyncio.gather(*(one(client, i) for i in range(streams)))
    return results.count(False), time.perf_counter() - started


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def report(
    series: dict[str, list[float]], errors: int, streams: int, elapsed: float, args, database: str
) -> str:
    rows = []
    for label, proxy, direct in (
        ("total", "proxy_total", "direct_total"),
        ("first byte", "proxy_first", "direct_first"),
    ):
        for p in (50, 95):
            a, b = percentile(series[proxy], p), percentile(series[direct], p)
            rows.append([f"{label} p{p}", ms(a), ms(b), ms(a - b), f"{a / b:.1f}x" if b else "-"])
    for name in ("append", "context", "upstream"):
        rows.append([f"proxy {name} (Server-Timing) p50", ms(percentile(series[name], 50)), "-", "-", "-"])
    rows.append(
        ["context pipeline in-process, no HTTP p50", ms(percentile(series["pipeline"], 50)), "-", "-", "-"]
    )
    first_added = percentile(series["proxy_first"], 50) - percentile(series["direct_first"], 50)
    beyond = first_added - percentile(series["append"], 50) - percentile(series["context"], 50)
    rows.append(["first byte added beyond append+context p50", ms(beyond), "-", "-", "-"])
    rows.append([f"{streams} concurrent streams: errors", str(errors), "-", "-", f"{elapsed:.1f} s in all"])
    header = machine_header(
        "bench/proxy.py",
        f"granian ASGI, 2 workers; {database}; {args.messages}-message conversation; {args.rounds} rounds",
    )
    table = render_table(["figure", "through Mnemo", "upstream direct", "added", "ratio"], rows)
    return f"{header}\n\n{table}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--sqlite", action="store_true", help="SQLite even when PostgreSQL is reachable")
    args = parser.parse_args()
    rng = random.Random(17)
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-proxy-") as scratch, contextlib.ExitStack() as stack:
        database_url, database = "", "SQLite"
        if not args.sqlite:
            try:
                from bench.context_latency import throwaway_database

                database_url = stack.enter_context(throwaway_database(PG_ADMIN))
                database = "PostgreSQL"
            except Exception as exc:  # no server: SQLite
                log(f"PostgreSQL not reachable ({type(exc).__name__}); using SQLite")
        django_setup(var_dir=Path(scratch), database_url=database_url)
        from tests.llm_server import LLMServer

        upstream = LLMServer().start()
        stack.callback(upstream.stop)
        upstream.reply = (
            "The export job hit the storage timeout again; the retry budget was lowered on Tuesday."
        )
        upstream.stream_pieces = 12
        started = time.perf_counter()
        key, conversation = seed(args.messages, rng)
        log(f"seeded {args.messages} messages in {time.perf_counter() - started:.1f}s")
        if database_url:
            analyze()
        env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
        env.update(
            DJANGO_SETTINGS_MODULE="config.django.local", DJANGO_DEBUG="false", DJANGO_ALLOWED_HOSTS=HOST,
            DJANGO_SECRET_KEY=secrets.token_urlsafe(50), MNEMO_VAR_DIR=scratch, DATABASE_URL=database_url,
            REDIS_URL="", LLM_BASE_URL=upstream.base_url, LLM_API_KEY="k", MNEMO_PROXY_DEADLINE_SECONDS="60",
            MNEMO_WARM_ON_START="true", MNEMO_LOG_LEVEL="WARNING",
            # Message vectors are a worker's job in a deployment; here they would embed the seeded 10k
            # messages on the server's own cores while it is measured.
            MNEMO_EMBED_ON_APPEND="false",
            # Background tasks (memory agent, compaction) are queued, not run on the server's threads: in a
            # deployment a worker runs them, and here they would take the GIL from the streams measured.
            CELERY_TASK_ALWAYS_EAGER=os.environ.get("BENCH_PROXY_EAGER", "false"),
        )  # fmt: skip
        port = free_port()
        log_path = Path(os.environ.get("BENCH_PROXY_LOG", Path(scratch) / "granian.log"))
        proc = server(env, 2, port, log_path)
        stack.callback(stop, proc)
        wait_ready(port, key, proc, log_path)
        log("server ready; sequential rounds")
        series = sequential(port, key, conversation, upstream, args.rounds, rng)
        series["pipeline"] = pipeline(conversation, 20, rng)
        log(f"{args.concurrency} concurrent streams")
        errors, elapsed = asyncio.run(concurrent(port, key, args.concurrency))
        print(report(series, errors, args.concurrency, elapsed, args, database))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
