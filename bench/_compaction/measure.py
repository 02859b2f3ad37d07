"""Compacting the conversation through the services and checking which planted facts the summaries kept.

Imported once django_setup() has run: it imports the apps at module level.
"""

from __future__ import annotations

import argparse
import random
import time

from bench._common import log
from bench._compaction.conversation import Planted, generate
from context.pipeline import context_assemble
from context.state import ContextRequest
from conversations.models import Message
from conversations.services import conversation_create, message_append_batch
from providers.summariser import SourceMessage, normalise, summarise
from providers.tokens import count_text
from summaries.selectors import history_start_seq, segment_prompt_text, segments_live
from summaries.services import compaction_run
from tenants.services import tenant_create


def kept(facts: list[Planted], text: str) -> dict[str, float]:
    shown = normalise(text)
    out: dict[str, float] = {}
    for kind in ("number", "path", "name", "decision"):
        group = [f for f in facts if f.kind == kind]
        out[kind] = sum(normalise(f.probe) in shown for f in group) / len(group)
    out["all"] = sum(normalise(f.probe) in shown for f in facts) / len(facts)
    return out


def prompt_tokens(conversation) -> int:
    state = context_assemble(
        conversation=conversation,
        request=ContextRequest(user_message="What should I do next?", token_budget=120_000, record=False),
    )
    return state.tokens["total"]


def b6_text(conversation, after_seq: int) -> str:
    return "\n".join(
        Message.objects.filter(conversation=conversation, kind="message", seq__gt=after_seq)
        .order_by("seq")
        .values_list("content", flat=True)
    )


def run(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    messages, facts = generate(rng, args.messages)
    tenant, _ = tenant_create(slug="bench", name="Bench")
    conversation = conversation_create(tenant=tenant, model="gpt-4o", title="compaction bench")
    uncompacted = conversation_create(tenant=tenant, model="gpt-4o", title="no compaction")
    chunk = args.messages // args.compactions

    times: list[float] = []
    baseline_summary = ""
    for k in range(args.compactions):
        part = messages[k * chunk : (k + 1) * chunk]
        for target in (conversation, uncompacted):
            for i in range(0, len(part), 100):
                message_append_batch(conversation=target, items=part[i : i + 100])
        cut_before = history_start_seq(conversation)
        started = time.perf_counter()
        outcome = compaction_run(conversation=conversation, trigger="auto", sync=False)
        times.append((time.perf_counter() - started) * 1000)
        b4_tokens = sum(s.token_count for s in segments_live(conversation=conversation))
        log(
            f"compaction {k + 1}: messages {outcome.start_seq}–{outcome.end_seq}, {outcome.source}, "
            f"{len(outcome.rollups)} roll-up(s), B4 {b4_tokens} tokens, {times[-1]:.0f} ms"
        )
        baseline_summary = summary_of_summary(
            conversation,
            baseline_summary,
            after_seq=cut_before,
            to_seq=outcome.end_seq,
            target_tokens=b4_tokens,
        )

    cut = history_start_seq(conversation)
    recent = b6_text(conversation, cut)
    live = segments_live(conversation=conversation)
    mnemo_b4 = "\n\n".join(segment_prompt_text(s) for s in live)
    before = prompt_tokens(uncompacted)
    after = prompt_tokens(conversation)
    baseline_after = after - sum(s.token_count for s in live) + count_text(baseline_summary, model="gpt-4o")
    return {
        "mnemo": kept(facts, mnemo_b4 + "\n" + recent),
        "baseline": kept(facts, baseline_summary + "\n" + recent),
        "before": before,
        "after": after,
        "baseline_after": baseline_after,
        "times": times,
        "segments": len(live),
        "b6_messages": Message.objects.filter(conversation=conversation, kind="message", seq__gt=cut).count(),
        "facts_checked": sum(s.facts_checked for s in live),
        "facts_missing": sum(s.facts_missing for s in live),
    }


def summary_of_summary(
    conversation, previous: str, *, after_seq: int, to_seq: int, target_tokens: int
) -> str:
    """The baseline: it compacts the same range as Mnemo did, folding its previous summary in, at the same
    token spend."""
    raw = Message.objects.filter(
        conversation=conversation, kind="message", seq__gt=after_seq, seq__lte=to_seq
    ).order_by("seq")
    sources = [SourceMessage(seq=0, role="system", text=previous)] if previous else []
    sources += [SourceMessage(seq=m.seq, role=m.role, text=m.content) for m in raw]
    return summarise(
        sources, target_tokens=target_tokens, count_tokens=lambda t: count_text(t, model="gpt-4o")
    )
