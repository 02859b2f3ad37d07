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
import math
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# Run as a script, Python puts bench/ first on sys.path, where this very file would shadow the prefix_cache
# app; the repository goes first instead, and the shared helpers are imported from it.
BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [str(BENCH_DIR.parent)] + [p for p in sys.path if Path(p or ".").resolve() != BENCH_DIR]

from bench._common import (  # noqa: E402
    MODEL,
    PROFILE_NAME,
    PROFILE_POLICY,
    PROFILE_SCOPE,
    Exchange,
    conversation_script,
    django_setup,
    log,
    machine_header,
    render_table,
    scratch_dir,
)

TARGET_STEADY_SHARE = 0.90
FIRST_STEADY_TURN = 3  # 0-based: in turns 1-3 the prompt is still near the 1,024-token minimum of any cache
# Stand-ins for the special tokens of the chat format (they are not text, so they never merge with it).
START, SEPARATOR, END = -1, -2, -3


# --- tokenising prompts ---------------------------------------------------------------------------------


class PromptTokenizer:
    """Tokens of an OpenAI-format prompt, one tuple per message, memoised by the message's bytes."""

    def __init__(self, encode: Callable[[str], list[int]], canonical: Callable[[Any], str]) -> None:
        self.encode = encode
        self.canonical = canonical
        self.memo: dict[str, tuple[int, ...]] = {}

    def message(self, message: dict[str, Any]) -> tuple[int, ...]:
        key = self.canonical(message)
        tokens = self.memo.get(key)
        if tokens is None:
            texts = [message.get("content") or ""]
            # A tool call counts as name(arguments), as Mnemo counts it when the message is stored: OpenAI
            # does not document how it serialises tool calls, and the ids never differ between two turns.
            texts += [
                f"{c['function']['name']}({c['function']['arguments']})"
                for c in message.get("tool_calls", [])
            ]
            body = [token for text in texts for token in self.encode(text)]
            tokens = (START, *self.encode(message["role"]), SEPARATOR, *body, END)
            self.memo[key] = tokens
        return tokens

    def prompt(self, messages: list[dict[str, Any]]) -> list[tuple[int, ...]]:
        return [self.message(m) for m in messages]


def common_prefix(a: list[tuple[int, ...]], b: list[tuple[int, ...]]) -> int:
    """Length in tokens of the longest common prefix of two tokenised prompts."""
    total = 0
    for x, y in zip(a, b, strict=False):
        if x == y:
            total += len(x)
            continue
        for p, q in zip(x, y, strict=False):
            if p != q:
                break
            total += 1
        break
    return total


# --- per-turn figures -----------------------------------------------------------------------------------


@dataclass
class TurnStat:
    prompt_tokens: int
    prefix_tokens: int  # common token prefix with the previous turn's prompt
    cached: int  # of which OpenAI would serve from its cache
    previous_tokens: int  # the previous turn's prompt
    event: str  # what reset the prefix at this turn ("" for nothing)
    predicted: int | None = None  # Mnemo's own prediction (prefix.predicted_cached_tokens)

    @property
    def moved(self) -> bool:
        return bool(self.event)

    @property
    def share(self) -> float:
        return self.cached / self.prompt_tokens

    @property
    def reused(self) -> float:
        """How much of the previous prompt this one starts with: 100 % means the layout lost nothing, and
        the uncached rest is only what the provider never saw (the reply, tool output, the new question)."""
        return self.prefix_tokens / self.previous_tokens if self.previous_tokens else 0.0


def turn_stats(
    prompts: list[list[dict[str, Any]]],
    events: list[str],
    tokenizer: PromptTokenizer,
    cacheable: Callable[[int], int],
    predicted: list[int] | None = None,
) -> list[TurnStat]:
    stats = []
    previous: list[tuple[int, ...]] | None = None
    for t, prompt in enumerate(prompts):
        tokens = tokenizer.prompt(prompt)
        size = sum(map(len, tokens))
        prefix = common_prefix(previous, tokens) if previous is not None else 0
        before = sum(map(len, previous)) if previous is not None else 0
        stats.append(
            TurnStat(
                prompt_tokens=size,
                prefix_tokens=prefix,
                cached=cacheable(prefix),
                previous_tokens=before,
                event=events[t],
                predicted=predicted[t] if predicted else None,
            )
        )
        previous = tokens
    return stats


# --- the two layouts ------------------------------------------------------------------------------------


@dataclass
class MnemoRun:
    budget: int
    prompts: list[list[dict[str, Any]]] = field(default_factory=list)
    # Per turn, what reset the prompt's prefix: "cut" (the history window moved, prompt only), "compacted"
    # (the compaction boundary moved: B4 gained a segment, B6 restarts), both, or "" (nothing).
    events: list[str] = field(default_factory=list)
    predicted: list[int] = field(default_factory=list)
    pipeline_tokens: list[int] = field(default_factory=list)
    call_ms: list[float] = field(default_factory=list)


def run_mnemo(tenant: Any, script: list[Exchange], budget: int) -> MnemoRun:
    from context.pipeline import context_assemble
    from context.serializers import context_payload
    from context.state import ContextRequest
    from conversations.services import conversation_create, message_append_batch

    conversation = conversation_create(tenant=tenant, model=MODEL, title=f"prefix bench, budget {budget}")
    run = MnemoRun(budget)
    boundary = 0
    for exchange in script:
        started = time.perf_counter()
        state = context_assemble(
            conversation=conversation,
            request=ContextRequest(
                user_message=exchange.question, token_budget=budget, model=MODEL, format="openai"
            ),
        )
        payload = context_payload(state)
        run.call_ms.append((time.perf_counter() - started) * 1e3)
        run.prompts.append(payload["messages"])
        reasons = {d.get("reason") for d in payload["dropped"] if d["block"] == "B6"}
        # A background compaction runs when a call commits (eagerly, in the embedded setup): its boundary
        # shows up in the next call's window, with nothing dropped by that call.
        new_boundary = payload["window"].get("boundary_seq", 0)
        compacted = "compacted" in reasons or new_boundary != boundary
        boundary = new_boundary
        run.events.append(
            "+".join(e for e, hit in (("compacted", compacted), ("cut", "budget" in reasons)) if hit)
        )
        run.predicted.append(payload["prefix"]["predicted_cached_tokens"])
        run.pipeline_tokens.append(payload["tokens"]["total"])
        over = [d for d in payload["degradations"] if d["code"] == "over_budget"]
        if over:
            log(f"  budget {budget}: {over[0]['message']}")
        message_append_batch(conversation=conversation, items=exchange.messages)
    return run


_SENTENCE_END = re.compile(r"(?<=[.?!])\s")


def first_sentence(text: str) -> str:
    return _SENTENCE_END.split(text.strip(), maxsplit=1)[0].split("\n", 1)[0]


class NaiveLayout:
    """What many agents do: a timestamp in the system prompt, a summary regenerated every turn, and the
    last N messages."""

    def __init__(self, profile_text: str, script: list[Exchange], clock: list[str]) -> None:
        from prefix_cache.rendering import HistoryMessage

        self.profile_text = profile_text
        self.script = script
        self.clock = clock
        self.stored: list[Any] = []  # the transcript as the database holds it, one entry per message
        self.stored_before: list[int] = []  # messages stored when turn t is asked
        for exchange in script:
            self.stored_before.append(len(self.stored))
            for m in exchange.messages:
                self.stored.append(
                    HistoryMessage(
                        id="", seq=len(self.stored) + 1, role=m["role"], content=m["content"],
                        parts=m["parts"], token_count=0,
                    )
                )  # fmt: skip

    def prompts(self, window: int) -> tuple[list[list[dict[str, Any]]], list[str]]:
        from prefix_cache.rendering import render_history

        prompts, events = [], []
        previous_start = 0
        for t, exchange in enumerate(self.script):
            stored = self.stored[: self.stored_before[t]]
            start = max(0, len(stored) - window)
            # A window that opened on a tool result or half a turn would be an invalid request.
            while start < len(stored) and stored[start].role != "user":
                start += 1
            older = [m for m in stored[:start] if m.content]
            system = self.profile_text
            if older:
                lines = "\n".join(f"- {m.role}: {first_sentence(m.content)}" for m in older)
                system += f"\n\nSummary of the earlier conversation:\n{lines}"
            system += f"\n\nCurrent time: {self.clock[t]}"
            prompts.append(
                [
                    {"role": "system", "content": system},
                    *render_history(stored[start:], "openai"),
                    {"role": "user", "content": exchange.question},
                ]
            )
            events.append("slid" if start > previous_start else "")
            previous_start = start
        return prompts, events


def naive_window_for(naive: NaiveLayout, tokenizer: PromptTokenizer, target_tokens: float) -> int:
    """The window (in messages) whose naive prompts are on average closest to `target_tokens`."""

    def mean_tokens(window: int) -> float:
        prompts, _ = naive.prompts(window)
        return statistics.fmean(sum(map(len, tokenizer.prompt(p))) for p in prompts)

    # The mean grows with the window (a message outweighs its summary line), so bisect.
    low, high = 2, max(2, len(naive.stored))
    while low < high:
        middle = (low + high) // 2
        if mean_tokens(middle) < target_tokens:
            low = middle + 1
        else:
            high = middle
    candidates = {max(2, low - 1), low}
    return min(sorted(candidates), key=lambda w: abs(mean_tokens(w) - target_tokens))


def tenant_settings(budget: int, scope: str, *, compact: bool) -> dict[str, int]:
    """Settings of the bench tenant. With scope "tenant" the budget is the tenant's own, which also sizes
    its compaction (history budget = 3/4 of it). The large run raises the history budget as well, so that
    neither the window nor compaction moves during the conversation and the steady state shows alone."""
    if scope == "request":
        return {}
    settings = {"token_budget": budget}
    if not compact:
        settings["history_token_budget"] = budget
    return settings


def turn_clock(rng: random.Random, turns: int) -> list[str]:
    """A plausible wall clock per turn: a minute to a quarter of an hour between turns."""
    now = datetime(2025, 3, 14, 9, 0, tzinfo=UTC)
    clock = []
    for _ in range(turns):
        now += timedelta(seconds=rng.randint(60, 900))
        clock.append(f"{now:%A, %Y-%m-%d %H:%M:%S} UTC")
    return clock


# --- report ---------------------------------------------------------------------------------------------


def pct(value: float) -> str:
    return f"{value:.1%}"


def ratio(ours: float, theirs: float) -> str:
    if theirs == 0:
        return "∞" if ours > 0 else "-"
    return f"{ours / theirs:.2f}"


Measure = Callable[[list[TurnStat]], float]

# A run where every turn reset its prefix has no steady turn: its figures are nan, not an error.


def _mean_share(which: list[int]) -> Measure:
    return lambda stats: statistics.fmean(stats[t].share for t in which) if which else math.nan


def _min_share(which: list[int]) -> Measure:
    return lambda stats: min(stats[t].share for t in which) if which else math.nan


def _summed(every: list[int]) -> Measure:
    # What the bill sees: cached tokens over prompt tokens of the whole conversation.
    return lambda stats: sum(stats[t].cached for t in every) / sum(stats[t].prompt_tokens for t in every)


def _reused(steady: list[int]) -> Measure:
    return lambda stats: statistics.fmean(stats[t].reused for t in steady) if steady else math.nan


def _ceiling(steady: list[int], cacheable: Callable[[int], int]) -> Measure:
    # The whole previous prompt as the cached prefix: only this turn's new messages are new.
    def measure(stats: list[TurnStat]) -> float:
        def best(t: int) -> float:
            return min(1.0, cacheable(stats[t - 1].prompt_tokens) / stats[t].prompt_tokens)

        return statistics.fmean(best(t) for t in steady) if steady else math.nan

    return measure


def _tokens(reduce: Callable[..., float]) -> Measure:
    return lambda stats: reduce(s.prompt_tokens for s in stats)


def section_rows(
    label: str,
    mnemo: list[TurnStat],
    naive: list[TurnStat],
    window: int,
    cacheable: Callable[[int], int],
) -> list[tuple[str, str, str, str]]:
    turns = len(mnemo)
    steady = [t for t in range(FIRST_STEADY_TURN, turns) if not mnemo[t].moved]
    every = list(range(1, turns))
    figures: list[tuple[str, Measure, Callable[[float], str]]] = [
        (f"mean cached share, steady turns (n={len(steady)})", _mean_share(steady), pct),
        (f"mean cached share, all turns 2..{turns} (n={len(every)})", _mean_share(every), pct),
        ("cached / prompt tokens summed over all turns", _summed(every), pct),
        ("min cached share, steady turns", _min_share(steady), pct),
        (f"min cached share, all turns 2..{turns}", _min_share(every), pct),
        ("previous prompt reused as prefix, steady", _reused(steady), pct),
        ("ceiling: whole previous prompt cached, steady", _ceiling(steady, cacheable), pct),
        ("mean prompt tokens", _tokens(statistics.fmean), lambda v: f"{v:,.0f}"),
        ("max prompt tokens", _tokens(max), lambda v: f"{v:,.0f}"),
    ]
    rows = [
        (f"{label}: {name}", fmt(measure(mnemo)), fmt(measure(naive)), ratio(measure(mnemo), measure(naive)))
        for name, measure, fmt in figures
    ]
    cuts = sum("cut" in s.event for s in mnemo)
    compactions = sum("compacted" in s.event for s in mnemo)
    rows.insert(
        7,
        (
            f"{label}: turns where the prefix was reset",
            f"{sum(s.moved for s in mnemo)} ({cuts} window cuts, {compactions} compactions)",
            f"{sum(s.moved for s in naive)} window slides (last {window} msgs)",
            "-",
        ),
    )
    # Mnemo's prediction for each call, scored like the measurement.
    predicted = [replace(s, cached=s.predicted or 0) for s in mnemo]
    rows.append(
        (
            f"{label}: Mnemo's own predicted_cached_tokens share, steady",
            pct(_mean_share(steady)(predicted)),
            "-",
            "-",
        )
    )
    return rows


def per_turn_table(label: str, mnemo: list[TurnStat], naive: list[TurnStat]) -> str:
    rows = []
    for t, (m, n) in enumerate(zip(mnemo, naive, strict=True)):
        rows.append(
            (
                str(t + 1),
                f"{m.prompt_tokens:,}",
                f"{m.prefix_tokens:,}",
                pct(m.share),
                m.event,
                f"{m.predicted:,}" if m.predicted is not None else "-",
                f"{n.prompt_tokens:,}",
                f"{n.prefix_tokens:,}",
                pct(n.share),
                n.event,
            )
        )
    head = ("turn", "Mnemo tokens", "common prefix", "cached", "reset", "predicted", "naive tokens",
            "common prefix", "cached", "reset")  # fmt: skip
    return f"\n{label}, per turn\n" + render_table(head, rows)


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
        from django.db import connections

        from context.services import agent_profile_create
        from prefix_cache.rendering import canonical_json
        from prefix_cache.usage import openai_cacheable
        from providers.model_table import model_info
        from providers.tokens import count_text, get_encoding
        from tenants.services import tenant_create

        encoding = get_encoding(model_info(MODEL).encoding)
        tokenizer = PromptTokenizer(encoding.encode_ordinary, canonical_json)
        script = conversation_script(
            random.Random(f"{args.seed}-transcript"), args.turns, lambda s: count_text(s, model=MODEL)
        )
        clock = turn_clock(random.Random(f"{args.seed}-clock"), args.turns)

        rows: list[tuple[str, str, str, str]] = []
        details = []
        headline = None
        runs = (
            ("small budget", args.budget, tenant_settings(args.budget, args.budget_scope, compact=True)),
            (
                "default budget",
                args.default_budget,
                tenant_settings(args.default_budget, args.budget_scope, compact=True),
            ),
            (
                "large budget",
                args.large_budget,
                tenant_settings(args.large_budget, args.budget_scope, compact=False),
            ),
        )
        for label, budget, settings in runs:
            log(
                f"[{label} {budget:,}] {args.turns} turns through the context pipeline, "
                f"tenant settings {settings}"
            )
            # A tenant per run: PrefixHints are per tenant, and the second run replays the first one's
            # transcript, so sharing one would let Mnemo's own prediction "hit" the other conversation.
            tenant, _ = tenant_create(slug=f"bench-prefix-{budget}", settings=settings)
            profile = agent_profile_create(
                tenant=tenant, name=PROFILE_NAME, scope=PROFILE_SCOPE, policy=PROFILE_POLICY, is_default=True
            )
            naive = NaiveLayout(profile.render(), script, clock)
            run = run_mnemo(tenant, script, budget)
            mnemo = turn_stats(run.prompts, run.events, tokenizer, openai_cacheable, run.predicted)
            target = statistics.fmean(s.prompt_tokens for s in mnemo)
            window = args.naive_window or naive_window_for(naive, tokenizer, target)
            naive_prompts, naive_events = naive.prompts(window)
            baseline = turn_stats(naive_prompts, naive_events, tokenizer, openai_cacheable)
            name = f"{label} ({budget:,})"
            rows += section_rows(name, mnemo, baseline, window, openai_cacheable)
            details.append(per_turn_table(name, mnemo, baseline))
            drift = max(abs(a - s.prompt_tokens) for a, s in zip(run.pipeline_tokens, mnemo, strict=True))
            log(
                f"  Mnemo: {sum(s.moved for s in mnemo)} prefix resets, "
                f"mean call {statistics.fmean(run.call_ms):.1f} ms; "
                f"naive window {window} messages; pipeline and bench token counts differ by ≤{drift} tokens"
            )
            if label == "default budget":
                steady = [t for t in range(FIRST_STEADY_TURN, len(mnemo)) if not mnemo[t].moved]
                headline = statistics.fmean(mnemo[t].share for t in steady)
        connections.close_all()

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
