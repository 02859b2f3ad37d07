"""One proxy run: the seeded conversation, the server, sequential rounds, concurrent streams, the report.

Imported once django_setup() has run: it imports the apps at module level.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import time
from pathlib import Path

from bench._common import log
from bench._proxy.report import report
from bench._proxy.seed import analyze, seed
from bench._proxy.server import proxy_env, server, wait_ready
from bench._proxy.streams import concurrent, pipeline, sequential
from bench._server import free_port, stop
from tests.llm_server import LLMServer


def run(args: argparse.Namespace, scratch: Path, database_url: str, stack: contextlib.ExitStack) -> str:
    rng = random.Random(17)
    upstream = LLMServer().start()
    stack.callback(upstream.stop)
    upstream.reply = "The export job hit the storage timeout again; the retry budget was lowered on Tuesday."
    upstream.stream_pieces = 12
    started = time.perf_counter()
    key, conversation = seed(args.messages, rng)
    log(f"seeded {args.messages} messages in {time.perf_counter() - started:.1f}s")
    if database_url:
        analyze()
    port = free_port()
    log_path = Path(os.environ.get("BENCH_PROXY_LOG", scratch / "granian.log"))
    proc = server(proxy_env(scratch, database_url, upstream.base_url), 2, port, log_path)
    stack.callback(stop, proc)
    wait_ready(port, key, proc, log_path)
    log("server ready; sequential rounds")
    series = sequential(port, key, conversation, upstream, args.rounds, rng)
    series["pipeline"] = pipeline(conversation, 20, rng)
    log(f"{args.concurrency} concurrent streams")
    errors, elapsed = asyncio.run(concurrent(port, key, args.concurrency))
    return report(series, errors, args.concurrency, elapsed, args, "PostgreSQL" if database_url else "SQLite")
