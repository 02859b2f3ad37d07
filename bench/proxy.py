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
import contextlib
import os
import sys
import tempfile
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository takes its place.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench._common import log  # noqa: E402
from bench._django import django_database, django_setup  # noqa: E402

PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--sqlite", action="store_true", help="SQLite even when PostgreSQL is reachable")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-proxy-") as scratch, contextlib.ExitStack() as stack:
        database_url = ""
        if not args.sqlite:
            try:
                database_url = stack.enter_context(django_database(PG_ADMIN))
            except Exception as exc:  # no server: SQLite
                log(f"PostgreSQL not reachable ({type(exc).__name__}); using SQLite")
        django_setup(var_dir=Path(scratch), database_url=database_url)
        # Imported here: the benchmark's modules import the apps, which needs django_setup() to have run.
        from bench._proxy.run import run

        print(run(args, Path(scratch), database_url, stack))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
