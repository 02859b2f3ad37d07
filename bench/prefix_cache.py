"""Share of each prompt that the provider's prefix cache can serve, turn after turn, for Mnemo's layout and
for a naive layout, over the same seeded conversation.

A tenant with a realistic agent profile (B1, ~600 tokens) talks for --turns turns (user question, sometimes
a tool call and its result, the assistant's answer; ~100-400 tokens a message). At every turn the context
pipeline is called for the user's question (openai format, gpt-4o) and the prompt it returns is recorded;
then the turn's messages are appended. This runs twice, each on a tenant of its own:
- --budget (8,000): the tenant's token_budget and every request's; its compaction is sized from it (history
  budget 3/4 of it), so both the window cut and compaction reset the prefix during the conversation;
- --default-budget (32,000, the service's MNEMO_DEFAULT_TOKEN_BUDGET): sized the same way; the headline and
  its target are taken here, at what a tenant gets without tuning;
- --large-budget (100,000), with the tenant's history_token_budget raised too: nothing ever moves.
With --budget-scope request only the requests carry the budget and the tenant keeps its defaults (32k, so
compaction is sized for 32k prompts while the prompts are cut at 8k).

Per turn, the figure is the OpenAI-cacheable share of the prompt: the longest common token prefix of this
prompt and the previous turn's, counted by OpenAI's rule (nothing under 1,024 tokens, then 128-token steps:
prefix_cache.usage.openai_cacheable), divided by this prompt's tokens. Prompts are tokenised message by
message with gpt-4o's encoding, each message wrapped in stand-ins for the chat format's special tokens
(start, role, separator, content and tool calls as name(arguments), end), so a token never straddles two
messages and the count equals the pipeline's own.

Baseline, from the same transcript in the same run: a naive layout built by this script. System message =
the same agent profile + a running summary (the first sentence of every message older than the window,
regenerated each turn) + "Current time: <the turn's timestamp>"; then the last N messages (N chosen so the
naive prompts are on average the size of Mnemo's) and the question.

A turn resets Mnemo's prefix when the window was cut (prompt only) or the compaction boundary moved: in the
call itself, or in a background compaction that ran when the previous call committed (eagerly, in-process,
in this embedded setup). Steady turns are turns 4..T without a reset; "all turns" are turns 2..T (turn 1
has no predecessor), resets included.

Each section also gives the ceiling of any layout that keeps the history verbatim: the share a turn would
get if the whole previous prompt were its cached prefix, so only the turn's new messages are new. At a
small budget the prompts stay short next to what a turn adds (~500-850 tokens here), which bounds the share
whatever the layout does.

Run from the repository root:  .venv/bin/python bench/prefix_cache.py
Options: --turns 50, --budget 8000, --default-budget 32000, --large-budget 100000, --budget-scope
tenant|request, --seed mnemo, --naive-window N, --per-turn (every turn of every run). Everything runs
in-process on a throwaway SQLite database under /tmp, removed at the end. Exits 1 when the steady-turn
target is missed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where this very file would shadow the prefix_cache
# app; the repository takes its place.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench._common import MODEL, machine_header, render_table  # noqa: E402
from bench._django import django_setup, scratch_dir  # noqa: E402
from bench._prefix_cache.turns import FIRST_STEADY_TURN  # noqa: E402

TARGET_STEADY_SHARE = 0.90
# Stand-ins for the special tokens of the chat format (they are not text, so they never merge with it).


# --- tokenising prompts ---------------------------------------------------------------------------------


# --- per-turn figures -----------------------------------------------------------------------------------


# --- the two layouts ------------------------------------------------------------------------------------


# --- report ---------------------------------------------------------------------------------------------


# A run where every turn reset its prefix has no steady turn: its figures are nan, not an error.


# --- main -----------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=50, help="user turns in the conversation")
    parser.add_argument("--budget", type=int, default=8000, help="token budget that forces window cuts")
    parser.add_argument(
        "--default-budget", type=int, default=32_000, help="the service's default token budget (the headline)"
    )
    parser.add_argument("--large-budget", type=int, default=100_000, help="token budget that never cuts")
    parser.add_argument("--seed", default="mnemo", help="seed of the transcript and the naive clock")
    parser.add_argument("--naive-window", type=int, help="naive window in messages (default: size-matched)")
    parser.add_argument("--per-turn", action="store_true", help="also print every turn")
    parser.add_argument(
        "--budget-scope",
        choices=("tenant", "request"),
        default="tenant",
        help="tenant: the budget is the tenant's token_budget too, so compaction is sized for it (default); "
        "request: only the requests carry it and compaction keeps the tenant defaults (32k)",
    )
    args = parser.parse_args()
    if args.turns < FIRST_STEADY_TURN + 2:
        parser.error(f"--turns must be at least {FIRST_STEADY_TURN + 2}")
    return args


def main() -> int:
    args = parse_args()
    started = time.perf_counter()
    with scratch_dir("mnemo-bench-prefix-") as scratch:
        django_setup(var_dir=scratch)
        # Imported here: the benchmark's modules import the apps, which needs django_setup() to have run.
        from bench._prefix_cache.run import run

        results = run(args)
    headline, rows, details = results.headline, results.rows, results.details
    assert headline is not None
    scope = "the tenant and each request" if args.budget_scope == "tenant" else "each request only"
    verdict = "met" if headline >= TARGET_STEADY_SHARE else "MISSED"
    print(
        machine_header(
            "bench/prefix_cache.py",
            f"{args.turns} turns, seed {args.seed!r}, model {MODEL}, openai format; budgets {args.budget:,}, "
            f"{args.default_budget:,} (the default) and {args.large_budget:,}, set on {scope}",
            f"steady = turns {FIRST_STEADY_TURN + 1}..{args.turns} at which Mnemo neither cut its window nor "
            "compacted",
            f"cached share = openai_cacheable(common token prefix with the previous prompt) / prompt tokens; "
            f"target ≥ {TARGET_STEADY_SHARE:.0%} on steady turns at the default budget: {verdict} "
            f"({headline:.1%}); run took {time.perf_counter() - started:.0f}s",
        )
    )
    print(render_table(("figure", "Mnemo", "naive baseline", "ratio"), rows))
    if args.per_turn:
        print("\n".join(details))
    return 0 if verdict == "met" else 1


if __name__ == "__main__":
    sys.exit(main())
