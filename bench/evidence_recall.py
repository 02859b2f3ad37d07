"""Evidence recall through the public API: does the prompt Mnemo's context endpoint returns hold the evidence
for a question asked at the end of a long real conversation? Measured as a client would, over HTTP only.

Data: public long multi-session chats with message-level evidence labels that nobody here wrote, by default
the set in /work/shared/data/beam-128k/ (its README describes it). Read in place, never copied into the
repository; --data takes any JSONL of the same schema.

Method:
1. Load. For each conversation and each budget B (a client keeps one budget per conversation), one Mnemo
   conversation, end user "<dataset id>-b<B>", its messages appended in seq order in batches
   (POST /api/v1/conversations/{id}/messages {"messages": [{role, content, created_at}, ...]}), with
   created_at from the data. A message over MNEMO_MAX_MESSAGE_BYTES is sent truncated to the limit and the
   header names each one; a message's `name` (its speaker) is sent when the data has one. Then wait, as a
   client that imported a history would, on the one readiness signal GET /api/v1/conversations/{id}
   reports (`readiness.ready`: vectors, the memory agent's reading, due compactions; --index-timeout). No
   context call before the questions: the first question at a budget is the first call at it.
2. Ask. Every question of the conversation, in dataset order, as if after the last message:
   POST .../context {"user_message": <question>, "token_budget": B, "format": "openai"}. Recorded per call:
   client wall time, tokens.total, timings, degradation codes, dropped blocks, B5's tokens and item scores.
3. Score. The prompt is every string of the response's system and messages (content strings, text parts).
   A dataset message is present when at least half of its distinct word trigrams, or at least 120 of them (a
   verbatim passage of a long message), are among the prompt's; a message of under 3 words when its words
   occur as a contiguous run of the prompt's words. Words: re.findall(r"\\w+", text.lower()). ER of a
   question = present evidence messages / evidence messages, over the questions marked scored.

Baselines in the same run, on the same questions and messages: recency (the newest messages that fit) and
BM25 over the conversation's messages, computed by the dataset's own baselines.py (imported by path, len/4
tokens), and its oracle (the evidence alone, smallest first) as the ceiling whole-message packing allows.
Abstention questions (nothing to find) are reported apart: the B5 tokens they pull in and B5's top score,
next to the same figures for the scored questions.

Targets: ER@2000 >= 0.75 overall and >= BM25@2000 + 0.20; ER@8000 >= 0.90; no category below BM25 at either
budget; no context call over 250 ms (client side); every call answered. Exits 1 when one is missed (a budget
not run is "not measured"), after printing everything.

Run from the repository root:  .venv/bin/python bench/evidence_recall.py   (or: make bench-quality)
By default it starts its own server: a fresh var dir (SQLite, Celery eager), migrate, a tenant, uvicorn on a
free port; stopped at the end, also on error or Ctrl-C.
  --data PATH [--baselines PATH]     another dataset of the same schema (its baselines.py is used when
                                     there is one next to it, else the beam-128k one)
  --conversations 01,04 | N          those conversations (id or id suffix; "10," for one) or the first N
  --max-questions N                  the first N questions of each conversation
  --budgets 2000 8000                token budgets
  --var-dir DIR [--keep] [--reload]  server data and a manifest (dataset id + budget -> Mnemo conversation,
                                     API key) in DIR; with --keep they stay, and a later run with the same DIR
                                     (same data file, same kind of server) loads only what is missing and
                                     asks; --reload loads again from scratch. One DIR per dataset.
  --database-url URL [--redis-url U] the started server on PostgreSQL, a new tenant per load (with Redis: a
                                     Celery worker too; without, tasks run eagerly in the server)
  --url URL --api-key KEY            an already running server: nothing started or stopped
Data not kept is removed at the end: the temporary var dir, or the conversations this run created.
  --index-timeout S                  seconds to wait for the conversations to be ready (1800)
  --json PATH                        per-question results (evidence seqs and which were present, ER,
                                     tokens, B5 tokens, latency, degradations)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository takes its place.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench._common import log  # noqa: E402
from bench._evidence.asking import ask_all, baselines  # noqa: E402
from bench._evidence.dataset import DATA_DIR, DEFAULT_DATA, read_dataset  # noqa: E402
from bench._evidence.loading import load_all, wait_conversations_ready  # noqa: E402
from bench._evidence.report import (  # noqa: E402
    abstention_table,
    degradation_table,
    er_table,
    header,
    latency_table,
    margin_table,
    scores,
)
from bench._evidence.session import prepare  # noqa: E402
from bench._evidence.targets import targets  # noqa: E402

BUDGETS = (2000, 8000)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--baselines", type=Path, help="baselines.py (default: next to --data, else beam's)")
    parser.add_argument("--conversations", help='a count ("2") or ids / suffixes ("01,04")')
    parser.add_argument("--max-questions", type=int, help="the first N questions of each conversation")
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    parser.add_argument("--var-dir", type=Path, help="server data and the manifest of a kept load")
    parser.add_argument("--keep", action="store_true", help="keep the loaded data (needs --var-dir)")
    parser.add_argument("--reload", action="store_true", help="load again even if --var-dir holds a load")
    parser.add_argument("--database-url", help="the started server on this PostgreSQL database")
    parser.add_argument("--redis-url", help="with --database-url: Redis, and a Celery worker")
    parser.add_argument("--url", help="an already running server (with --api-key)")
    parser.add_argument("--api-key")
    parser.add_argument("--index-timeout", type=float, default=1800.0)
    parser.add_argument("--json", type=Path, help="write per-question results here")
    args = parser.parse_args()
    if args.url and not args.api_key:
        parser.error("--url needs --api-key")
    if args.url and args.database_url:
        parser.error("--url and --database-url exclude each other (the running server has its database)")
    if args.redis_url and not args.database_url:
        parser.error("--redis-url needs --database-url")
    if args.keep and not args.var_dir:
        parser.error("--keep needs --var-dir")
    args.budgets = sorted(set(args.budgets))
    default_base = args.data.parent / "baselines.py"
    args.baselines = args.baselines or (default_base if default_base.exists() else DATA_DIR / "baselines.py")
    return args


def run(args: argparse.Namespace) -> int:
    dataset = read_dataset(args.data, args.conversations, args.max_questions)
    with contextlib.ExitStack() as stack:
        session = prepare(args, dataset, stack)
        log(f"loading {len(dataset.conversations)} conversations x {len(args.budgets)} budgets …")
        load = load_all(session, dataset, args.budgets)
        loaded = session.manifest["conversations"]
        ids = [loaded[c["id"]][str(b)] for c in dataset.conversations for b in args.budgets]
        load.index_seconds, load.index_note = wait_conversations_ready(session.api, ids, args.index_timeout)
        log(f"asking {sum(len(c['questions']) for c in dataset.conversations)} questions per budget …")
        rows = ask_all(session.api, dataset, args.budgets, session.manifest)
    base_er, base_full, base_n = baselines(args.baselines, dataset, args.budgets)
    s = scores(rows, base_er, base_full, args.budgets)
    head = header(dataset, session.service, load, args, args.baselines)
    if base_n != s.n["*"]:
        head += f"\n# WARNING: baselines scored {base_n} questions, Mnemo {s.n['*']}"
    verdicts, met = targets(s, rows, args.budgets)
    tables = [er_table(s, args.budgets), margin_table(s, args.budgets), latency_table(rows, args.budgets)]
    tables += [abstention_table(rows, args.budgets), degradation_table(rows, args.budgets), verdicts]
    print("\n\n".join([head + "\n" + tables[0], *tables[1:]]))
    if args.json:
        args.json.write_text(json.dumps({"header": head.splitlines(), "results": rows}, indent=1))
    return 0 if met else 1


def interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    args = parse_args()
    # Ctrl-C and a plain kill both unwind the stack, so the server and its worker are always stopped (a
    # background job may even have inherited SIGINT as ignored).
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    started = time.perf_counter()
    try:
        code = run(args)
    except KeyboardInterrupt:
        log("interrupted; whatever this run started was stopped")
        return 130
    log(f"run took {time.perf_counter() - started:.0f}s ({datetime.now(UTC):%H:%M} UTC)")
    return code


if __name__ == "__main__":
    sys.exit(main())
