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
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository takes its place.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench._common import log  # noqa: E402
from bench._django import django_database, django_setup  # noqa: E402


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
        django_database(args.pg_url, f"mnemo_bench_ctx_{os.getpid()}") as database_url,
    ):
        django_setup(var_dir=Path(scratch), database_url=database_url)
        # Imported here: the benchmark's modules import the apps, which needs django_setup() to have run.
        from bench._context_latency.run import run

        text, ok = run(args)
    print(text)
    log(f"run took {time.perf_counter() - started:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
