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
import shutil
import signal
import sys
import tempfile
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository takes its place.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench._append.measure import AppendRun, run_backend  # noqa: E402
from bench._append.report import header, table  # noqa: E402
from bench._append.tokens import bench_tokens  # noqa: E402
from bench._common import log, render_table  # noqa: E402
from bench._server import server_version  # noqa: E402


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
    print(render_table(["figure", "value", "baseline", "ratio"], table(runs, tokens)))
    failed = any(r.appends.errors or r.gets.errors or not r.verified for r in runs)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        # The servers, the database and the temp dirs were removed on the way out.
        log("interrupted")
        sys.exit(130)
