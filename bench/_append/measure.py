"""One measurement per backend, server and worker count: warm-up, the read baseline, the appends and the
check."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench._append.backend import Backend, prepare, verify
from bench._append.client import (
    Job,
    PhaseResult,
    append_jobs,
    create_conversations,
    get_jobs,
    new_loop,
    run_jobs,
)
from bench._append.servers import http_server
from bench._common import log
from bench._server import server_env, throwaway_database


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


@dataclass
class AppendRun:
    label: str
    server: str
    workers: int
    gets: PhaseResult
    appends: PhaseResult
    verified: bool
    verify_note: str


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
        database_url = stack.enter_context(throwaway_database(args.pg_url)) if label.startswith("PG") else ""
        backend = Backend(
            label, server_env(var_dir, DATABASE_URL=database_url, REDIS_URL=redis_url), var_dir, database_url
        )
        api_key = prepare(backend)
        return [
            measure(backend, api_key, server, workers, args)
            for server in args.servers
            for workers in args.workers
        ]
