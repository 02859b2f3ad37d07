"""One recall run: the sessions built through the services, then every question asked of the three prompts.

Imported once django_setup() has run: it imports the apps at module level.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from bench._common import MODEL, log
from bench._recall.facts import Fact, Question
from bench._recall.plan import plan, scripts, values_are_distinctive
from bench._recall.prompts import bm25_prompt, mnemo_prompt, question_tokens, recency_prompt
from context.pipeline import context_assemble
from context.state import ContextRequest
from conversations.models import Message
from conversations.services import conversation_create, message_append_batch
from providers.tokens import count_text
from tenants.services import tenant_create

BUDGETS = (1_000, 2_000, 4_000)
TARGET_BUDGET = 2_000
USER = "dana"
SYSTEMS = ("Mnemo", "recency window", "plain BM25")
KINDS = ("single", "two facts", "changed")


def planned(args: argparse.Namespace) -> tuple[list[Fact], list[Question], list[list[Any]]]:
    """The facts, the questions and the sessions' scripts; planted values must occur nowhere in the filler."""
    rng = random.Random(args.seed)
    counts = {"single": args.single, "two": args.two, "changed": args.changed}
    facts, questions = plan(rng, args.conversations, args.turns, counts)
    plans = scripts(rng, args.conversations, args.turns, facts, lambda s: count_text(s, model=MODEL))
    texts = [m.get("content", "") for script in plans for ex in script for m in ex.messages] + [
        json.dumps(m.get("parts", [])) for script in plans for ex in script for m in ex.messages
    ]
    clashes = values_are_distinctive(facts, texts)
    if clashes:
        raise SystemExit(f"planted values also occur in the filler (change --seed): {clashes}")
    return facts, questions, plans


def build(
    tenant: Any, plans: list[list[Any]], facts: list[Fact], context_every: int
) -> tuple[list[Any], float]:
    """Append every exchange through the services, ask for the context as a client would (recorded, default
    budget: compaction runs as in production) and let the memory agent run after each completed exchange."""
    started = time.perf_counter()
    conversations = []
    where = {(c, t): fact for fact in facts for c, t in fact.turns}
    for c, script in enumerate(plans):
        conversation = conversation_create(
            tenant=tenant, end_user_external_id=USER, model=MODEL, title=f"session {c + 1}"
        )
        conversations.append(conversation)
        for t, exchange in enumerate(script):
            user = message_append_batch(conversation=conversation, items=exchange.messages[:1])[0].message
            if (c, t) in where:
                fact = where[(c, t)]
                fact.seqs.append(user.seq)
            if t % context_every == 0:
                context_assemble(
                    conversation=conversation, request=ContextRequest("", user_message_id=user.id)
                )
            message_append_batch(conversation=conversation, items=exchange.messages[1:])
        log(f"  session {c + 1}: {len(script)} exchanges ({time.perf_counter() - started:.0f}s)")
    return conversations, time.perf_counter() - started


@dataclass
class Score:
    hits: int = 0
    total: int = 0
    stale_only: int = 0
    changed: int = 0
    tokens: list[int] = field(default_factory=list)

    def add(self, question: Question, text: str, tokens: int) -> None:
        self.total += 1
        self.tokens.append(tokens)
        found = all(v in text for v in question.required)
        self.hits += found
        if question.kind == "changed":
            self.changed += 1
            self.stale_only += (not found) and any(v in text for v in question.stale)

    @property
    def recall(self) -> float:
        return self.hits / self.total if self.total else 0.0


@dataclass
class Built:
    """What the sessions left: the last conversation, the baselines' material and the history's size."""

    last: Any
    corpus: list[tuple[str, int]]  # every user/assistant message of the end user: BM25's material
    recent: list[tuple[str, int]]  # the last conversation's messages: the recency window's
    stats: dict[str, int]
    seconds: float


def built(conversations: list[Any], seconds: float) -> Built:
    last = conversations[-1]
    end_user = last.end_user
    of_user: QuerySet[Message] = Message.objects.filter(
        conversation__end_user=end_user, kind=Message.Kind.MESSAGE
    )
    rows = of_user.filter(role__in=[Message.Role.USER, Message.Role.ASSISTANT]).exclude(content="")
    recent = Message.objects.filter(conversation=last, kind=Message.Kind.MESSAGE).order_by("seq")
    stats = {
        "messages": of_user.count(),
        "tokens": sum(of_user.values_list("token_count", flat=True)),
        "memories": end_user.archival_memories.filter(invalidated_at__isnull=True).count(),
        "segments": sum(c.summary_segments.count() for c in conversations),
    }
    return Built(
        last,
        list(rows.values_list("content", "token_count")),
        list(recent.values_list("content", "token_count")),
        stats,
        seconds,
    )


@dataclass
class Results:
    scores: dict[tuple[str, int], Score] = field(
        default_factory=lambda: {(s, b): Score() for s in SYSTEMS for b in BUDGETS}
    )
    by_kind: dict[tuple[str, int], Score] = field(
        default_factory=lambda: {(k, b): Score() for k in KINDS for b in BUDGETS}
    )
    blocks_found: dict[str, int] = field(default_factory=dict)  # where each required value was @ target
    latencies: dict[int, list[float]] = field(default_factory=lambda: {b: [] for b in BUDGETS})


def ask(question: Question, history: Built, results: Results) -> None:
    """One question at every budget, of Mnemo and of both baselines."""
    own = question_tokens(question.text)
    for budget in BUDGETS:
        text, tokens, blocks, ms = mnemo_prompt(history.last, question.text, budget)
        results.latencies[budget].append(ms)
        results.scores[("Mnemo", budget)].add(question, text, tokens)
        results.by_kind[(question.kind, budget)].add(question, text, tokens)
        if budget == TARGET_BUDGET:
            for value in question.required:
                where = [name for name, block in blocks.items() if value in block]
                key = " + ".join(where) if where else ("elsewhere" if value in text else "missing")
                results.blocks_found[key] = results.blocks_found.get(key, 0) + 1
        text, tokens = recency_prompt(history.recent, budget - own)
        results.scores[("recency window", budget)].add(question, text, tokens + own)
        text, tokens = bm25_prompt(question.text, history.corpus, budget - own)
        results.scores[("plain BM25", budget)].add(question, text, tokens + own)


def run(args: argparse.Namespace) -> tuple[list[Fact], list[Question], Built, Results]:
    facts, questions, plans = planned(args)
    tenant, _ = tenant_create(slug=f"bench-recall-{args.seed}", name="bench recall")
    log(f"building {args.conversations} sessions of {args.turns} exchanges …")
    history = built(*build(tenant, plans, facts, args.context_every))
    results = Results()
    log(f"asking {len(questions)} questions at {', '.join(f'{b:,}' for b in BUDGETS)} tokens …")
    for question in questions:
        ask(question, history, results)
    return facts, questions, history, results
