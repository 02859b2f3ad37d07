"""The append benchmark's header and table: each figure with its baseline and the ratio."""

from __future__ import annotations

import argparse
import os

from bench._append.client import REPLAY_RATE
from bench._append.cpu import CORES
from bench._append.measure import AppendRun, fmt_ms
from bench._append.tokens import TokenRun
from bench._common import machine_header
from bench._server import GRANIAN_THREADS

TARGET_PG_APPENDS_PER_S = 400


def header(args: argparse.Namespace, pg_version: str) -> str:
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
