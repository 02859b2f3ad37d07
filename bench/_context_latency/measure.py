"""Timing the context call as the API makes it, interleaved across sizes with the database floor, and where a
call's queries and CPU time go."""

from __future__ import annotations

import cProfile
import gc
import io
import itertools
import os
import pstats
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connection
from rest_framework.renderers import JSONRenderer

from bench._common import (
    log,
    percentile,
)
from context.pipeline import context_assemble
from context.serializers import context_payload
from context.state import ContextRequest
from conversations.selectors import access_conversation

# The user's new question: every call asks another one (more of them than the query-vector cache holds), so
# each call embeds its question as a new turn would; the same question again would be served from the cache.
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
        s.prompt_segments = len(state.layout.summaries)
        s.prompt_messages = len(state.layout.history)
        s.prompt_tokens = state.tokens["total"]
        if s.prompt_segments != s.segments or any(d.block == "B6" for d in state.dropped):
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
            moved = [d for d in state.dropped if d.block == "B6"]
            if moved:
                log(f"  warning: {s.label} moved its window during the timed calls: {moved}")
    return floor


def query_breakdown(tenant: Any, s: Series, calls: int, show: bool) -> None:
    """Count the queries of one call (inside the clock only) and, to show where the time goes, the median
    round trip of each over `calls` calls."""
    timings: dict[int, list[float]] = {}
    texts: dict[int, str] = {}
    current: list[float] = []

    def timed(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            # A fixed statement (tenants.statements) is a psycopg Composed, not a str.
            texts.setdefault(
                len(current), sql if isinstance(sql, str) else sql.as_string(connection.connection)
            )
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
