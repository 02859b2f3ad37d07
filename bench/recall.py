"""Evidence recall over a multi-session history: does the prompt Mnemo assembles still carry the facts a
question needs, hundreds of turns and several conversations after they were said?

One end user (an engineer) talks to an operations assistant over --conversations conversations of --turns
exchanges each, in order, through the real services: every exchange is appended as a client would (the user
message, then the assistant's reply, sometimes after a tool call), the client asks for the context before
each reply (the default 32k budget, recorded, so compaction runs exactly as in production: the offline
extractive summariser, since no LLM is configured), and the memory agent runs after each completed exchange
(its rules; the LLM path needs a model). Filler is bench/_common's realistic engineering chat, about the same
services as the facts, with the facts' subjects also mentioned in passing without a value.

Planted among it: facts the user states in passing ("btw Priya rotated the staging deploy key for ledger,
it's QW-4821 now"), each with a known evidence turn and a distinctive value (checked to occur nowhere else).
Questions, phrased unlike the statements, are asked at the end of the last conversation:
- single: one fact, possibly from an earlier conversation;
- two facts: both values must be in the prompt;
- changed: the fact was stated and later changed; the NEW value must be in the prompt (how often only the
  stale value is there is reported separately).

Each question is a dry-run context call (context_assemble, record=False: nothing is compacted or moved)
with token_budget 1,000 / 2,000 / 4,000; the prompt is the system message plus every message. A question
counts as recalled when all its required values are in the prompt. Baselines in the same run, each given the
same budget less the question's own tokens (they send the question too; Mnemo counts it in its budget):
- recency window: the newest messages of the last conversation that fit;
- plain BM25: the best BM25 hits (question as query) over every user/assistant message of the user's
  conversations, added in rank order while they fit.
No agent profile (B1) is configured, so Mnemo spends its budget on the same material as the baselines. Also
printed: recall per kind of question, where in Mnemo's prompt each value was found, the context call's time.

Target at 2k: Mnemo >= 0.85 and at least twice the recency window.

Run from the repository root:  .venv/bin/python bench/recall.py   (about 3 minutes; --quick: 5 sessions of
80 exchanges; --pg: a throwaway PostgreSQL database instead of SQLite; --seed). Exits 1 when the target is
missed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository takes its place.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench._common import log  # noqa: E402
from bench._django import django_database, django_setup, scratch_dir  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 sessions x 80 exchanges, fewer questions")
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=320, help="exchanges per conversation")
    parser.add_argument("--single", type=int, default=30, help="single-fact questions")
    parser.add_argument("--two", type=int, default=10, help="two-fact questions")
    parser.add_argument("--changed", type=int, default=10, help="changed-fact questions")
    parser.add_argument("--context-every", type=int, default=1, help="context call every N exchanges")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--pg", action="store_true", help="a throwaway PostgreSQL database (see --pg-url)")
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/postgres", help="admin URL")
    args = parser.parse_args()
    if args.quick:
        args.conversations, args.turns, args.single, args.two, args.changed = 5, 80, 12, 4, 4
    if args.conversations < 1 or args.turns < 10:
        parser.error("at least one conversation of 10 exchanges")
    return args


def measured(args: argparse.Namespace) -> tuple[str, bool]:
    # Imported here: the benchmark's modules import the apps, which needs django_setup() to have run.
    from bench._recall.report import report
    from bench._recall.run import run

    return report(args, *run(args))


def main() -> int:
    args = parse_args()
    # Every dry-run call logs the degradations this set-up has on purpose (no LLM, maybe no embeddings); the
    # header states them once.
    os.environ.setdefault("MNEMO_LOG_LEVEL", "ERROR")
    started = time.perf_counter()
    with scratch_dir("mnemo-bench-recall-") as scratch, contextlib.ExitStack() as stack:
        url = stack.enter_context(django_database(args.pg_url)) if args.pg else ""
        django_setup(var_dir=Path(scratch), database_url=url)
        text, met = measured(args)
    print(text)
    log(f"run took {time.perf_counter() - started:.0f}s")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
