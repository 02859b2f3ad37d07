"""Latency of the context call on PostgreSQL for conversations of 100 to 100,000 messages.

In-process (no HTTP): a throwaway database mnemo_bench_ctx_<pid> is created on the local PostgreSQL,
migrated, filled and dropped at the end, also on error, Ctrl-C or SIGTERM. One tenant with a realistic agent
profile; one conversation per size, filled with bulk_create from a pool of realistic messages (questions,
answers, tool calls and results) whose token_count is what the write path stores (count_message).
Defaults throughout: model gpt-4o, openai format, the default 32k budget and compaction settings.

A conversation that grew to 100k messages has been compacted many times on the way, so each one carries the
compaction records its last compactions would have written (compaction_history): boundaries and summaries
(two segments and a roll-up of everything older) in the transcript shape an import brings, placed so that
the history since the last boundary is midway between two compactions. The first call rebuilds the summary
segments from them; no timed call compacts or cuts, and every size shows the same kind of prompt: B1, three
B4 segments, ~9k tokens of B6. What differs is only how much lies underneath.

Timed: context_assemble + context_payload + the JSON rendering of the payload (DRF's JSONRenderer, as the
API does), --calls calls per size after --warmup untimed ones (the first call rebuilds the segments). The
conversation is fetched with access_conversation before each call, outside the clock, as the view does.
Calls are interleaved: each round times one call per size and one SELECT 1, in a seeded shuffled order, so
a busy moment of the machine hits all of them alike.

Baselines in the same run: the 1,000-message conversation (target: 100k within 1.3x of it) and the
database floor, a SELECT 1 round trip through the ORM connection.
Targets: p50 <= 20 ms and p99 <= 60 ms at 10k messages; 100k p50 <= 1.3 x 1k p50.

Besides wall time the table shows this process's CPU time per call (the rest is waiting on PostgreSQL
or for a core), the first call and what this process's resident memory grew by in it (the conversation's
index: passages, postings, vectors; measured after a full collection), the queries inside the clock, and
p50 / p99 of each stage from state.timings, plus prepare+commit (what context_assemble spends outside its
stages) and payload+JSON; stages that are not built yet and take no time are left out. The header gives
the load average: PostgreSQL and anything else running share the machine's cores.

Run from the repository root:  .venv/bin/python bench/context_latency.py
Options: --quick (30 calls), --sizes 100,1000,10000,100000, --calls 200, --warmup 10, --seed, --pg-url
(admin connection), --profile (to stderr: each query's median round trip, and a CPU-time cProfile of the
largest size). Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import itertools
import os
import pstats
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository goes first instead, and the shared helpers are imported from it.
BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [str(BENCH_DIR.parent)] + [p for p in sys.path if Path(p or ".").resolve() != BENCH_DIR]

from bench._common import (  # noqa: E402
    MODEL,
    PROFILE_NAME,
    PROFILE_POLICY,
    PROFILE_SCOPE,
    buffered_statistics_flush,
    conversation_script,
    django_setup,
    log,
    machine_header,
    percentile,
    render_table,
    summary_text,
)

BASELINE_SIZE = 1_000
TARGET_SIZE = 10_000
TARGET_P50_MS = 20.0
TARGET_P99_MS = 60.0
TARGET_LARGEST_RATIO = 1.3
POOL_EXCHANGES = 200  # distinct exchanges the conversations are drawn from (~550 distinct messages)
INSERT_BATCH = 5_000
# The user's new question: every call asks another one (320 of them, more than the query-vector cache
# holds), so each call embeds its question as a new turn would; the same question again would be served
# from the cache (5 ms less: the first version of this benchmark asked one question throughout).
SUBJECTS = (
    "The export job", "The nightly backup", "The billing sync", "The search indexer", "The deploy pipeline",
    "The report generator", "The invoice batch", "The cache warmer",
)  # fmt: skip
PROBLEMS = (
    "failed again last night with a timeout from the storage service after the third batch",
    "ran twice as long as usual and then stopped without an error",
    "logged retries against the queue for an hour this morning",
    "hit the memory limit on the worker again",
    "wrote half of its output and then hung",
)
ASKS = (
    "Can you check what changed since Tuesday?", "Is it the same problem as last week?",
    "What did we decide to do about it last time?", "Which config did we touch before it started?",
    "Who owned the fix the last time?", "What was the workaround we used?", "Did the retry budget change?",
    "When did this first happen?",
)  # fmt: skip
QUESTIONS = [f"{s} {p}. {a}" for s in SUBJECTS for p in PROBLEMS for a in ASKS]
_asked = itertools.count()


@contextlib.contextmanager
def throwaway_database(admin_url: str) -> Iterator[str]:
    """A fresh database on the server of `admin_url`; dropped afterwards whatever happened."""
    import psycopg

    name = f"mnemo_bench_ctx_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        buffered_statistics_flush()  # while the database is there, not at exit into a dropped one
        with contextlib.suppress(Exception):
            from django.db import connection

            connection.close()
            connection.close_pool()  # the psycopg pool would otherwise keep sessions on the database
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        log(f"dropped database {name}")


# --- filling the conversations --------------------------------------------------------------------------


def message_pool(seed: str) -> list[list[dict[str, Any]]]:
    """Exchanges (lists of messages) with the token_count the write path would store for each message."""
    from conversations.parts import parts_token_text
    from providers.tokens import count_message, count_text

    script = conversation_script(
        random.Random(f"{seed}-pool"), POOL_EXCHANGES, lambda s: count_text(s, model=MODEL)
    )
    pool = []
    for exchange in script:
        messages = []
        for m in exchange.messages:
            tokens = count_message(
                role=m["role"], content=m["content"], model=MODEL, extra_text=parts_token_text(m["parts"])
            )
            messages.append({**m, "token_count": tokens})
        pool.append(messages)
    return pool


def _exchange_start(messages: list[dict[str, Any]], index: int) -> int:
    """The nearest index at or before `index` where an exchange starts (a user message)."""
    while index > 0 and messages[index]["role"] != "user":
        index -= 1
    return index


def _back(messages: list[dict[str, Any]], end: int, tokens: int) -> int:
    """The exchange start from which messages[start:end] hold about `tokens`."""
    total, index = 0, end
    while index > 0 and total < tokens:
        index -= 1
        total += messages[index]["token_count"]
    return _exchange_start(messages, index)


def _forward(messages: list[dict[str, Any]], start: int, tokens: int) -> int:
    """The first exchange start at or after the point where messages[start:] reach `tokens`."""
    total, index = 0, start
    while index < len(messages) and total < tokens:
        total += messages[index]["token_count"]
        index += 1
    while index < len(messages) and messages[index]["role"] != "user":
        index += 1
    return index


@dataclass
class Segment:
    start: int  # message indexes (0-based) of the summarised range, inclusive
    end: int
    level: int
    built_from: str
    text: str = ""


def compaction_history(messages: list[dict[str, Any]], cfg: Any) -> dict[int, list[Segment]]:
    """Where the last compactions of a conversation that grew to `messages` left their records, as the
    tenant's compaction settings would have: each time the history since the boundary reached the background
    share of the history budget, all but the newest `keep` share was summarised, and older segments were
    rolled up. Returns {index of the message the records follow: segments written}. The history left after
    the last boundary sits mid-way between two compactions, so no call during the measurement compacts."""
    reached = cfg.background * cfg.history_budget  # B6 tokens when a background compaction starts
    kept = int(cfg.keep * reached)
    summarised = int(reached) - kept
    b6_start = _back(messages, len(messages), int(reached * (1 + cfg.keep) / 2))
    if b6_start == 0:
        return {}
    latest_start = _back(messages, b6_start, summarised)
    batches = {_forward(messages, b6_start, kept) - 1: [Segment(latest_start, b6_start - 1, 0, "raw")]}
    if latest_start > 0:
        # The compaction before it, which also rolled every older segment up into one.
        previous_start = _back(messages, latest_start, summarised)
        written = [Segment(previous_start, latest_start - 1, 0, "raw")]
        if previous_start > 0:
            written.insert(0, Segment(0, previous_start - 1, 1, "segments"))
        batches[_forward(messages, latest_start, kept) - 1] = written
    return dict(sorted(batches.items()))


def fill(
    conversation: Any, size: int, pool: list[list[dict[str, Any]]], rng: random.Random
) -> tuple[float, int]:
    """`size` messages, whole exchanges drawn from the pool (the last one cut to fit), with the compaction
    records (boundary + summaries) where compaction would have written them, in the transcript shape an
    import carries: the first context call rebuilds the summary segments from them. Returns (seconds,
    segments written)."""
    from conversations.models import Conversation, Message
    from providers.tokens import count_message
    from summaries.conf import compaction_config
    from summaries.models import SummarySegment
    from summaries.selectors import END_SEQ_KEY
    from summaries.services.compaction import BOUNDARY_TEXT

    started = time.perf_counter()
    messages: list[dict[str, Any]] = []
    while len(messages) < size:
        messages += rng.choice(pool)
    del messages[size:]
    cfg = compaction_config(conversation)
    batches = compaction_history(messages, cfg)

    def count(text: str) -> int:
        return count_message(role="user", content=text, model=MODEL)

    created = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)
    rows: list[Any] = []
    seq = 0
    seq_of: dict[int, int] = {}  # message index -> seq

    def add(**fields: Any) -> None:
        nonlocal seq
        seq += 1
        rows.append(
            Message(
                conversation=conversation, seq=seq, created_at=created + timedelta(seconds=20 * seq), **fields
            )
        )
        if len(rows) == INSERT_BATCH:
            Message.objects.bulk_create(rows)
            rows.clear()

    for index, m in enumerate(messages):
        add(role=m["role"], content=m["content"], parts=m["parts"], token_count=m["token_count"])
        seq_of[index] = seq
        for segment in batches.get(index, []):
            start, end = seq_of[segment.start], seq_of[segment.end]
            if segment is batches[index][0]:
                add(
                    role=Message.Role.SYSTEM,
                    kind=Message.Kind.COMPACT_BOUNDARY,
                    content=BOUNDARY_TEXT,
                    metadata={
                        "trigger": "auto",
                        "startSeq": start,
                        END_SEQ_KEY: seq_of[batches[index][-1].end],
                    },
                    idempotency_key=f"compaction:{seq_of[batches[index][-1].end]}",
                )
            source_tokens = sum(messages[i]["token_count"] for i in range(segment.start, segment.end + 1))
            # A segment as long as the summariser aims for; a roll-up a third of the summary budget.
            target = min(int(source_tokens * cfg.summary_ratio), cfg.summary_budget // 3)
            text = summary_text(rng, count, target if segment.level == 0 else cfg.summary_budget // 3)
            add(
                role=Message.Role.USER,
                kind=Message.Kind.COMPACT_SUMMARY,
                content=text,
                token_count=count(text),
                metadata={
                    "segment": {
                        "id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                        "startSeq": start,
                        "endSeq": end,
                        "level": segment.level,
                        "source": SummarySegment.Source.EXTRACTIVE,
                        "builtFrom": segment.built_from,
                        "templateVersion": "bench",
                    },
                    "supersedes": [],
                },
            )
    if rows:
        Message.objects.bulk_create(rows)
    Conversation.objects.filter(pk=conversation.pk).update(last_seq=seq)
    return time.perf_counter() - started, sum(len(b) for b in batches.values())


def embed_all(conversation: Any) -> float:
    """Retrieval vectors for every message, as the background task would have written them (the pool's
    texts repeat, so most re-use the vectors of the same text)."""
    from conversations.embedding import message_vectors_fill

    started = time.perf_counter()
    message_vectors_fill(conversation_id=conversation.id)
    return time.perf_counter() - started


# --- measuring ------------------------------------------------------------------------------------------


@dataclass
class Series:
    label: str
    size: int  # messages in the conversation (0 for the SELECT 1 floor)
    conversation_id: Any = None
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)  # this process's CPU time over the same span
    stages: dict[str, list[float]] = field(default_factory=dict)  # ms, as state.timings reports them
    first_call: float = 0.0  # the first call on the conversation (it rebuilds the segments from the records)
    first_call_mb: float = 0.0  # what this process's resident memory grew by in that call (the index)
    segments: int = 0  # summary segments written with the compaction records
    prompt_segments: int = 0  # B4 segments and B6 messages the prompt shows
    prompt_messages: int = 0
    prompt_tokens: int = 0
    load_seconds: float = 0.0
    vectors_seconds: float = 0.0
    queries: int = 0

    def ms(self, p: float) -> float:
        return percentile(self.seconds, p) * 1e3

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.seconds) * 1e3


def context_call(tenant: Any, series: Series) -> tuple[float, float, Any]:
    """One context call as the API makes it; the clock covers assembly, payload and its JSON. Returns
    (wall seconds, CPU seconds, state); the state's timings gain `prepare+commit` and `payload+JSON`."""
    from rest_framework.renderers import JSONRenderer

    from context.pipeline import context_assemble
    from context.serializers import context_payload
    from context.state import ContextRequest
    from conversations.selectors import access_conversation

    conversation = access_conversation(tenant=tenant, conversation_id=series.conversation_id)
    request = ContextRequest(user_message=QUESTIONS[next(_asked) % len(QUESTIONS)])
    cpu_started = time.process_time()
    started = time.perf_counter()
    state = context_assemble(conversation=conversation, request=request)
    assembled = time.perf_counter()
    JSONRenderer().render(context_payload(state))
    finished = time.perf_counter()
    cpu = time.process_time() - cpu_started
    # What context_assemble spends outside its stages: prepare() (tenant, context state) and the commit.
    state.timings["prepare+commit"] = (assembled - started) * 1e3 - sum(state.timings.values())
    state.timings["payload+JSON"] = (finished - assembled) * 1e3
    return finished - started, cpu, state


def resident_mb() -> float:
    """This process's resident memory in MB after a full collection (Linux /proc; 0 elsewhere)."""
    gc.collect()
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def floor_call() -> float:
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return time.perf_counter() - started


def measure(tenant: Any, series: list[Series], calls: int, warmup: int, rng: random.Random) -> Series:
    floor = Series("SELECT 1 (database floor)", 0)
    for s in series:
        resident = resident_mb()
        s.first_call, _, state = context_call(tenant, s)
        s.first_call_mb = resident_mb() - resident
        for _ in range(warmup - 1):
            _, _, state = context_call(tenant, s)
        s.prompt_segments = len(state.layout.b4)
        s.prompt_messages = len(state.layout.b6)
        s.prompt_tokens = state.tokens["total"]
        if s.prompt_segments != s.segments or any(d["block"] == "B6" for d in state.dropped):
            # The records did not replay as compaction would have left them (the transcript format changed?):
            # the figures are then not those of a steady conversation.
            log(
                f"  warning: {s.label}: B4 shows {s.prompt_segments} of {s.segments} segments; "
                f"dropped {state.dropped}"
            )
    for _ in range(warmup):
        floor_call()
    order: list[Series | None] = [*series, None]
    for _ in range(calls):
        rng.shuffle(order)
        for s in order:
            if s is None:
                floor.seconds.append(floor_call())
                continue
            elapsed, cpu, state = context_call(tenant, s)
            s.seconds.append(elapsed)
            s.cpu_seconds.append(cpu)
            for stage, ms in state.timings.items():
                s.stages.setdefault(stage, []).append(ms)
            # Retrieval hits that did not fit and summary segments over their share are every call's
            # ordinary trimming; a history cut would mean the prompts were not all of the same kind.
            moved = [d for d in state.dropped if d["block"] == "B6"]
            if moved:
                log(f"  warning: {s.label} moved its window during the timed calls: {moved}")
    return floor


def query_breakdown(tenant: Any, s: Series, calls: int, show: bool) -> None:
    """Count the queries of one call (inside the clock only) and, to show where the time goes, the median
    round trip of each over `calls` calls."""
    from django.db import connection

    from context.pipeline import context_assemble
    from context.serializers import context_payload
    from context.state import ContextRequest
    from conversations.selectors import access_conversation

    timings: dict[int, list[float]] = {}
    texts: dict[int, str] = {}
    current: list[float] = []

    def timed(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            texts.setdefault(len(current), sql)
            current.append(time.perf_counter() - started)

    for _ in range(calls):
        conversation = access_conversation(tenant=tenant, conversation_id=s.conversation_id)
        current.clear()
        with connection.execute_wrapper(timed):
            context_payload(context_assemble(conversation=conversation, request=ContextRequest(QUESTIONS[0])))
        for index, seconds in enumerate(current):
            timings.setdefault(index, []).append(seconds)
    s.queries = len(timings)
    if show:
        total = sum(statistics.median(v) for v in timings.values()) * 1e3
        log(f"\nqueries of one call, {s.label} (median of {calls} calls; sum {total:.2f} ms, plus COMMIT):")
        for index, values in timings.items():
            log(f"  {statistics.median(values) * 1e3:6.3f} ms  {' '.join(texts[index].split())[:150]}")


def profile_calls(tenant: Any, s: Series, calls: int) -> None:
    # CPU time, not wall time: other processes on the machine should not show up as our functions' cost.
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for _ in range(calls):
        context_call(tenant, s)
    profiler.disable()
    for order, lines in (("cumulative", 40), ("tottime", 25)):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(lines)
        log(f"\ncProfile (CPU time) of {calls} calls, {s.label}, by {order}:\n{out.getvalue()}")


# --- report ---------------------------------------------------------------------------------------------


def report(
    series: list[Series], floor: Series, args: argparse.Namespace, context: list[str]
) -> tuple[str, bool]:
    baseline = next((s for s in series if s.size == BASELINE_SIZE), None)
    table = _latency_table(series, floor, baseline)
    stages = _stage_table(series)
    checks = _target_checks(series, baseline)
    ok = all(verdict == "met" for _, _, verdict in checks)
    verdicts = render_table(("target", "measured", "verdict"), checks) if checks else ""
    header = machine_header("bench/context_latency.py", *context)
    return f"{header}\n{table}\n\n{stages}\n\n{verdicts}", ok


def _latency_table(series: list[Series], floor: Series, baseline: Series | None) -> str:
    def vs_baseline(value: float) -> str:
        return f"{value / baseline.ms(50):.2f}" if baseline else "-"

    rows = [
        (
            f"{s.size:,} messages",
            f"{s.prompt_segments} + {s.prompt_messages} / {s.prompt_tokens:,}",
            f"{s.ms(50):.2f}",
            f"{s.ms(99):.2f}",
            f"{s.mean_ms:.2f}",
            f"{statistics.fmean(s.cpu_seconds) * 1e3:.2f}",
            f"{s.first_call * 1e3:.1f}",
            f"{s.first_call_mb:.1f}",
            str(s.queries),
            vs_baseline(s.ms(50)),
        )
        for s in series
    ]
    floor_ms = (f"{floor.ms(50):.2f}", f"{floor.ms(99):.2f}", f"{floor.mean_ms:.2f}")
    rows.append((floor.label, "-", *floor_ms, "-", "-", "-", "1", vs_baseline(floor.ms(50))))
    head = ("conversation", "B4 segs + B6 msgs / tokens", "p50 ms", "p99 ms", "mean ms", "CPU ms (mean)",
            "first call ms", "first call +MB", "queries", "p50 ratio vs 1k")  # fmt: skip
    return render_table(head, rows)


def _stage_table(series: list[Series]) -> str:
    # p99 next to p50: a tail that sits in one stage (a plan, a commit) shows where to look.
    stage_names = [name for name in series[0].stages if max(max(s.stages[name]) for s in series) >= 0.05]
    stage_rows = [
        (
            f"{s.size:,} messages",
            *[
                f"{percentile(s.stages[name], 50):.2f} / {percentile(s.stages[name], 99):.1f}"
                for name in stage_names
            ],
        )
        for s in series
    ]
    return render_table(("stage ms, p50 / p99", *stage_names), stage_rows)


def _target_checks(series: list[Series], baseline: Series | None) -> list[tuple[str, str, str]]:
    """(target, measured, met or MISSED) for the latency at TARGET_SIZE and the largest size's growth."""
    checks = []
    target = next((s for s in series if s.size == TARGET_SIZE), None)
    if target:
        met = target.ms(50) <= TARGET_P50_MS and target.ms(99) <= TARGET_P99_MS
        checks.append(
            (
                f"{TARGET_SIZE:,} messages: p50 ≤ {TARGET_P50_MS:.0f} ms, p99 ≤ {TARGET_P99_MS:.0f} ms",
                f"{target.ms(50):.2f} / {target.ms(99):.2f} ms",
                "met" if met else "MISSED",
            )
        )
    largest = max(series, key=lambda s: s.size)
    if baseline and largest.size > BASELINE_SIZE:
        ratio = largest.ms(50) / baseline.ms(50)
        checks.append(
            (
                f"{largest.size:,} p50 within {TARGET_LARGEST_RATIO}x of {BASELINE_SIZE:,} p50",
                f"{ratio:.2f}x ({largest.ms(50):.2f} vs {baseline.ms(50):.2f} ms)",
                "met" if ratio <= TARGET_LARGEST_RATIO else "MISSED",
            )
        )
    return checks


def context_lines(
    args: argparse.Namespace, series: list[Series], pg_version: str, *, load: tuple[float, float]
) -> list[str]:
    """The header's lines on what was measured and how busy the machine was."""
    from providers.embeddings import embedder_status

    loads = ", ".join(f"{s.size:,} in {s.load_seconds:.1f}s" for s in series)
    model = embedder_status().embedder
    vectors = f"retrieval vectors of every message ({model.name})" if model else "no embedding model"
    return [
        f"{pg_version} on this machine; in-process context call (assemble + payload + JSON), "
        f"model {MODEL}, default budget, openai format",
        f"{args.calls} timed calls per size after {args.warmup} warm-up calls, interleaved; "
        f"seed {args.seed!r}; loaded with bulk_create: {loads}; {vectors}",
        # The database and everything else on the machine share its cores: say how busy it was.
        f"1-minute load average {load[0]:.1f} before timing, {load[1]:.1f} after",
    ]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="100,1000,10000,100000", help="conversation sizes, comma-separated"
    )
    parser.add_argument("--calls", type=int, default=200, help="timed calls per size")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls per size first")
    parser.add_argument("--quick", action="store_true", help="30 timed calls and 3 warm-up calls per size")
    parser.add_argument("--seed", default="mnemo")
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/postgres", help="admin URL")
    parser.add_argument("--profile", action="store_true", help="print queries and a cProfile to stderr")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.warmup = 30, 3
    args.sizes = sorted({int(size.replace("_", "")) for size in args.sizes.split(",")})
    if args.calls < 1 or args.warmup < 1 or min(args.sizes) < 1:
        parser.error("--calls, --warmup and every size must be at least 1")
    return args


def main() -> int:
    args = parse_args()
    # A SIGTERM (e.g. from a CI timeout) unwinds like Ctrl-C, so the database is dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="mnemo-bench-ctx-") as scratch,
        throwaway_database(args.pg_url) as database_url,
    ):
        django_setup(var_dir=Path(scratch), database_url=database_url)
        from django.db import connection

        from context.services import agent_profile_create
        from conversations.services import conversation_create
        from tenants.services import tenant_create

        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            pg_version = f"PostgreSQL {cursor.fetchone()[0].split()[0]}"
        tenant, _ = tenant_create(slug="bench-ctx")
        agent_profile_create(
            tenant=tenant, name=PROFILE_NAME, scope=PROFILE_SCOPE, policy=PROFILE_POLICY, is_default=True
        )
        log("building the message pool ...")
        pool = message_pool(args.seed)
        rng = random.Random(f"{args.seed}-fill")
        series = []
        for size in args.sizes:
            conversation = conversation_create(tenant=tenant, model=MODEL, title=f"{size} messages")
            s = Series(f"{size:,} messages", size, conversation.id)
            s.load_seconds, s.segments = fill(conversation, size, pool, rng)
            s.vectors_seconds = embed_all(conversation)
            log(f"loaded {size:,} messages in {s.load_seconds:.1f}s, vectors in {s.vectors_seconds:.1f}s")
            series.append(s)
        with connection.cursor() as cursor:
            # Fresh statistics, as autovacuum would have gathered on a table that grew this way.
            cursor.execute("ANALYZE")
        log(f"timing {args.calls} calls per size ...")
        load_before = os.getloadavg()[0]
        floor = measure(tenant, series, args.calls, args.warmup, random.Random(f"{args.seed}-order"))
        load_after = os.getloadavg()[0]
        for s in series:
            query_breakdown(tenant, s, calls=20 if args.profile else 1, show=args.profile)
        if args.profile:
            profile_calls(tenant, series[-1], calls=min(args.calls, 100))
        context = context_lines(args, series, pg_version, load=(load_before, load_after))
        text, ok = report(series, floor, args, context)
    print(text)
    log(f"run took {time.perf_counter() - started:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
