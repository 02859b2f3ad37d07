"""One prefix-cache run per budget: Mnemo's prompts and a size-matched naive window over the same transcript.

Imported once django_setup() has run: it imports the apps at module level.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass, field

from django.db import connections

from bench._common import (
    MODEL,
    PROFILE_NAME,
    PROFILE_POLICY,
    PROFILE_SCOPE,
    Exchange,
    conversation_script,
    log,
)
from bench._prefix_cache.layouts import NaiveLayout, naive_window_for, run_mnemo, tenant_settings, turn_clock
from bench._prefix_cache.report import per_turn_table, section_rows
from bench._prefix_cache.tokens import PromptTokenizer
from bench._prefix_cache.turns import FIRST_STEADY_TURN, turn_stats
from context.services import agent_profile_create
from prefix_cache.rendering import canonical_json
from prefix_cache.usage import openai_cacheable
from providers.model_table import model_info
from providers.tokens import count_text, get_encoding
from tenants.services import tenant_create


@dataclass
class Material:
    """What every run of one invocation shares: the transcript, the naive layout's clock, the tokenizer."""

    script: list[Exchange]
    clock: list[str]
    tokenizer: PromptTokenizer
    naive_window: int | None


@dataclass
class Results:
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    headline: float | None = None  # the steady turns' mean share at the default budget


def one_run(label: str, budget: int, settings: dict[str, int], material: Material, results: Results) -> None:
    turns = len(material.script)
    log(f"[{label} {budget:,}] {turns} turns through the context pipeline, tenant settings {settings}")
    # A tenant per run: PrefixHints are per tenant, and the second run replays the first one's
    # transcript, so sharing one would let Mnemo's own prediction "hit" the other conversation.
    tenant, _ = tenant_create(slug=f"bench-prefix-{budget}", settings=settings)
    profile = agent_profile_create(
        tenant=tenant, name=PROFILE_NAME, scope=PROFILE_SCOPE, policy=PROFILE_POLICY, is_default=True
    )
    tokenizer = material.tokenizer
    naive = NaiveLayout(profile.render(), material.script, material.clock)
    run = run_mnemo(tenant, material.script, budget)
    mnemo = turn_stats(run.prompts, run.events, tokenizer, openai_cacheable, run.predicted)
    target = statistics.fmean(s.prompt_tokens for s in mnemo)
    window = material.naive_window or naive_window_for(naive, tokenizer, target)
    naive_prompts, naive_events = naive.prompts(window)
    baseline = turn_stats(naive_prompts, naive_events, tokenizer, openai_cacheable)
    name = f"{label} ({budget:,})"
    results.rows += section_rows(name, mnemo, baseline, window, openai_cacheable)
    results.details.append(per_turn_table(name, mnemo, baseline))
    drift = max(abs(a - s.prompt_tokens) for a, s in zip(run.pipeline_tokens, mnemo, strict=True))
    log(
        f"  Mnemo: {sum(s.moved for s in mnemo)} prefix resets, "
        f"mean call {statistics.fmean(run.call_ms):.1f} ms; "
        f"naive window {window} messages; pipeline and bench token counts differ by ≤{drift} tokens"
    )
    if label == "default budget":
        steady = [t for t in range(FIRST_STEADY_TURN, len(mnemo)) if not mnemo[t].moved]
        results.headline = statistics.fmean(mnemo[t].share for t in steady)


def run(args: argparse.Namespace) -> Results:
    encoding = get_encoding(model_info(MODEL).encoding)
    material = Material(
        conversation_script(
            random.Random(f"{args.seed}-transcript"), args.turns, lambda s: count_text(s, model=MODEL)
        ),
        turn_clock(random.Random(f"{args.seed}-clock"), args.turns),
        PromptTokenizer(encoding.encode_ordinary, canonical_json),
        args.naive_window,
    )
    results = Results()
    for label, budget, compact in (
        ("small budget", args.budget, True),
        ("default budget", args.default_budget, True),
        ("large budget", args.large_budget, False),
    ):
        settings = tenant_settings(budget, args.budget_scope, compact=compact)
        one_run(label, budget, settings, material, results)
    connections.close_all()
    return results
