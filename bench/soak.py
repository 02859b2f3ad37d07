"""Soak: a real server under sustained mixed load, once in the embedded default (SQLite, the server's own
worker process) and once distributed (PostgreSQL, Redis, a Celery worker, the API on granian's WSGI workers as
docs/operations.md deploys it), as a user would run them.

16 clients, each with a conversation of its own, append (single messages and batches, with `created_at`, and
`name` when the server takes it), ask for context at several budgets, stream through the chat proxy against
a local fake upstream (tests/llm_server.py), import a transcript, upload a document and edit core memory,
paced to a total request rate. Reported per configuration: requests by status, HTML error bodies, p50/p99 per
endpoint, messages acknowledged versus stored, seq gaps, the embedding lag (append acknowledged -> vector
written) and the backlog of messages without vectors over time, how long the backlog takes to drain once the
load stops, tasks left queued, the memory agent caught up, the server's resident memory (minute 2 and the
end), and how busy the machine was during the load (cores each part used, threads ready to run per core).

Run from the repository root:  .venv/bin/python bench/soak.py   (or: make bench-soak)
Options: --minutes N (default 10), --short (2 minutes), --only embedded|distributed, --clients N (16),
--rate N (requests per second, all clients together; default 20), --port N (first port, 8100),
--database-url URL and --redis-url URL (the distributed run; its database is dropped and created again),
--server granian|uvicorn (the distributed run's API server; uvicorn on config.asgi is `make run`'s).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository takes its place.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench._common import machine_header  # noqa: E402
from bench._server import HOST  # noqa: E402
from bench._soak.report import report  # noqa: E402
from bench._soak.run import run  # noqa: E402
from bench._soak.stack import distributed_stack, embedded_stack, port_from  # noqa: E402
from bench._soak.throughput import throughput_report  # noqa: E402
from tests.llm_server import LLMServer, _Server  # noqa: E402


def upstream_start(port: int) -> Any:
    """The fake OpenAI-compatible upstream (tests/llm_server.py) on a port of ours."""
    upstream = LLMServer()
    handler = upstream.httpd.RequestHandlerClass
    upstream.httpd.server_close()
    upstream.httpd = _Server((HOST, port), handler)
    upstream.httpd.daemon_threads = True
    upstream.thread = threading.Thread(target=upstream.httpd.serve_forever, kwargs={"poll_interval": 0.05})
    upstream.thread.daemon = True
    upstream.thread.start()
    upstream.reply = "Noted: the export runs nightly and the ledger listens on port 23456."
    return upstream


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--short", action="store_true", help="2 minutes per configuration")
    parser.add_argument("--only", choices=["embedded", "distributed"])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second, all clients together")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/mnemo_soak")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--workers", type=int, default=1, help="Celery workers of the distributed run")
    parser.add_argument(
        "--server-processes", type=int, default=1, help="server processes of the distributed run"
    )
    parser.add_argument(
        "--server",
        choices=["granian", "uvicorn"],
        default="granian",
        help="the distributed run's API server: granian's WSGI workers (production) or uvicorn (make run)",
    )
    parser.add_argument("--appends-only", action="store_true", help="sustained ingest: single appends only")
    parser.add_argument(
        "--throughput", action="store_true", help="embedding throughput of 1 and 2 Celery workers, then stop"
    )
    args = parser.parse_args()
    if args.short:
        args.minutes = 2.0
    return args


def soak(args: argparse.Namespace, upstream: Any, upstream_port: int) -> None:
    """The embedded run, then the distributed one (or the one --only names), each on a fresh var dir."""
    for which in ["embedded", "distributed"]:
        if args.only and args.only != which:
            continue
        with tempfile.TemporaryDirectory(prefix=f"mnemo-soak-{which}-") as scratch:
            port = port_from(upstream_port + 1)
            if which == "embedded":
                stack = embedded_stack(Path(scratch), upstream.base_url, port)
            else:
                stack = distributed_stack(
                    Path(scratch),
                    upstream.base_url,
                    port,
                    args.database_url,
                    args.redis_url,
                    args.workers,
                    args.server_processes,
                    args.server,
                )
            print("\n" + report(run(stack, args)) + "\n", flush=True)


def main() -> None:
    # A soak stopped from outside (timeout, ^C) still stops its servers: the finally clauses run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = parse_args()
    upstream_port = port_from(args.port)
    upstream = upstream_start(upstream_port)
    header = [
        f"{args.clients} clients, {args.rate:g} requests/s together, {args.minutes:g} min per configuration"
        if not args.throughput
        else f"{args.clients} conversations of 300 messages appended, then 1 or 2 Celery workers started"
    ]
    print(machine_header("bench/soak.py", *header), flush=True)
    try:
        if args.throughput:
            print("\n" + throughput_report(args, upstream.base_url, upstream_port + 1) + "\n", flush=True)
        else:
            soak(args, upstream, upstream_port)
    finally:
        upstream.httpd.shutdown()


if __name__ == "__main__":
    main()
