"""What an append pays to publish its event to the conversation's sockets: the private publisher loop of
conversations/events.py (one event loop on a thread of its own; the append's on-commit hook hands it the
event with call_soon_threadsafe and returns) against the plain version (async_to_sync(group_send) per event
in the on-commit hook, the appending thread waits for the send). Baseline in the same run: the plain version.

Each row appends --appends single user messages through conversations.services.message_append_batch (on
SQLite in a temp dir; the vectors-on-append work is off, so the publisher is all that differs) on the
in-memory channel layer and, when it answers, channels_redis at --redis-url. Columns:
- publish µs: the time the appending thread spends in one event's on-commit publish (p50, p95);
- append ms: the whole append, publish included (p50), and without any publish (no channel layer);
- all sent ms: from the first append until the publisher has sent the last event (the private loop sends
  after the append returned; the plain version before);
- delivered: events a member of the conversation's group received, of those published.

Run from the repository root: .venv/bin/python bench/events.py [--appends 300] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository takes its place.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench._django import django_setup  # noqa: E402
from bench._events.report import report  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--appends", type=int, default=300, help="measured appends per row")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    # An append's vectors are computed on commit when there is an embedder: off, only the publisher differs.
    os.environ["MNEMO_EMBEDDINGS"] = "none"
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-events-") as scratch:
        django_setup(var_dir=Path(scratch))
        # Imported here: the benchmark's modules import the apps, which needs django_setup() to have run.
        from bench._events.measure import run

        bare, results = run(args.appends, args.redis_url)
    print(report(args, bare, results, load=(load_before, os.getloadavg()[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
