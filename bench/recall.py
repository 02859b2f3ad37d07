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
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository goes first instead.
BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [str(BENCH_DIR.parent)] + [p for p in sys.path if Path(p or ".").resolve() != BENCH_DIR]

from bench._common import (  # noqa: E402
    MODEL,
    conversation_script,
    django_setup,
    log,
    machine_header,
    percentile,
    render_table,
    scratch_dir,
)

BUDGETS = (1_000, 2_000, 4_000)
TARGET_BUDGET = 2_000
TARGET_RECALL = 0.85
TARGET_RATIO = 2.0
USER = "dana"

# --- the facts ---------------------------------------------------------------------------------------------
# Each subject: how the user states it (first time, and when it changes), how a question asks for it, and a
# noun phrase for questions that need two facts. {svc} is a service, {person} a colleague, {v} the value.

SERVICES = ["ledger", "checkout", "notifications", "identity", "catalog", "payouts", "telemetry", "scheduler"]
COLLEAGUES = ["Priya", "Tomás", "Mei", "Jonas", "Amara"]
NAMES = [
    "Ingrid Solberg", "Tariq Haddad", "Beatriz Okafor", "Hiroshi Tanabe", "Odile Marchetti", "Radek Novak",
    "Leilani Kealoha", "Gustavo Ferreira", "Yara Lindqvist", "Anselm Baptiste", "Noor Al-Rashid",
    "Wendell Achebe",
]  # fmt: skip
WORDS = [
    "falcon",
    "quartz",
    "juniper",
    "cobalt",
    "meridian",
    "tundra",
    "saffron",
    "obsidian",
    "lantern",
    "harbor",
]
REGIONS = ["eu2", "use1", "apse3", "euc1", "usw2"]


def _letters(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(n))


VALUES = {
    "key": lambda rng: f"{_letters(rng, 2)}-{rng.randint(1000, 9999)}",
    "port": lambda rng: str(rng.randint(20000, 64999)),
    "pager": lambda rng: f"+44 20 7946 {rng.randint(1000, 9999)}",
    "person": lambda rng: rng.choice(NAMES),
    "flag": lambda rng: f"ff_{rng.choice(WORDS)}_rollout_v{rng.randint(2, 9)}",
    "bucket": lambda rng: f"acme-{rng.choice(WORDS)}-archive-{rng.choice(REGIONS)}",
    "host": lambda rng: f"bastion-{rng.randint(10, 99)}.{rng.choice(REGIONS)}.acme.internal",
    "ticket": lambda rng: f"INC-{rng.randint(10000, 99999)}",
    "version": lambda rng: f"{rng.randint(6, 9)}.{rng.randint(21, 48)}.{rng.randint(10, 30)}",
    "rate": lambda rng: f"{rng.randint(11, 97)}50 requests per minute",
    "email": lambda rng: (
        f"{rng.choice('abdeghkmrst')}.{rng.choice(WORDS)}@northwind-{rng.randint(10, 99)}.example"
    ),
    "channel": lambda rng: f"#ops-{rng.choice(WORDS)}-{rng.choice(WORDS)}",
    "date": lambda rng: f"2025-{rng.randint(10, 12)}-{rng.randint(10, 28)}",
    "amount": lambda rng: f"${rng.randint(21, 89)},{rng.randint(1, 9)}00",
    "word": lambda rng: f"{rng.choice(WORDS).title()}{rng.choice(WORDS).title()}{rng.randint(10, 99)}",
}

SUBJECTS: list[dict[str, Any]] = [
    {
        "id": "deploy_key",
        "value": "key",
        "state": [
            "btw {person} rotated the staging deploy key for {svc} this morning, it's {v} now.",
            "Note for later: the deploy key for {svc} on staging is {v}.",
        ],
        "update": ["Heads-up, the {svc} staging deploy key changed again: use {v} from now on."],
        "ask": ["I'm about to push {svc} to staging. Which key do I need for that?"],
        "noun": "the key for staging deploys of {svc}",
    },
    {
        "id": "db_port",
        "value": "port",
        "state": ["The {svc} staging Postgres does not listen on 5432, it's on port {v}."],
        "update": ["They moved the {svc} staging database; it answers on port {v} now."],
        "ask": ["I can't connect to the {svc} staging DB, what port was it on again?"],
        "noun": "the port of the {svc} staging database",
    },
    {
        "id": "owner",
        "value": "person",
        "state": ["{v} took over ownership of {svc} last sprint, so questions about it go to them."],
        "update": ["Org change: {svc} is owned by {v} as of this week."],
        "ask": ["Who should I talk to about {svc} these days?"],
        "noun": "who owns {svc}",
    },
    {
        "id": "flag",
        "value": "flag",
        "state": ["We're gating the new {svc} flow behind a feature flag called {v}."],
        "update": ["The old flag for the {svc} flow is gone; the toggle is {v} now."],
        "ask": ["What's the name of the toggle that guards the new {svc} flow?"],
        "noun": "the name of the feature toggle for the new {svc} flow",
    },
    {
        "id": "bucket",
        "value": "bucket",
        "state": ["{svc} writes its nightly archive into the S3 bucket {v}."],
        "update": ["We migrated the {svc} archive; it lands in {v} from tonight."],
        "ask": ["Where does {svc} put its nightly archive, which bucket?"],
        "noun": "the bucket the {svc} archive goes to",
    },
    {
        "id": "bastion",
        "value": "host",
        "state": ["To reach the {svc} boxes you have to hop through {v} first."],
        "update": ["New jump host for {svc}: {v}, the old one is decommissioned."],
        "ask": ["Which jump host do I ssh through to get at the {svc} machines?"],
        "noun": "the jump host for the {svc} machines",
    },
    {
        "id": "incident",
        "value": "ticket",
        "state": ["I opened {v} for yesterday's {svc} outage, please reference it in the postmortem."],
        "update": ["The {svc} outage ticket was merged into {v}, use that one."],
        "ask": ["What was the ticket number for the {svc} outage?"],
        "noun": "the ticket of the {svc} outage",
    },
    {
        "id": "pin",
        "value": "version",
        "state": ["We pinned the {svc} client SDK to {v} until the retry bug is fixed upstream."],
        "update": ["Upstream fixed it, so the {svc} SDK pin moved to {v}."],
        "ask": ["Which SDK version is {svc} locked to right now?"],
        "noun": "the SDK version {svc} is locked to",
    },
    {
        "id": "rate",
        "value": "rate",
        "state": ["The partner API that {svc} calls throttles us at {v}."],
        "update": ["The partner raised the {svc} limit: {v} as of Monday."],
        "ask": ["How hard can {svc} hit the partner API before it gets throttled?"],
        "noun": "the partner API limit for {svc}",
    },
    {
        "id": "contact",
        "value": "email",
        "state": ["Northwind's technical contact for the {svc} integration is {v}."],
        "update": ["Northwind has a new contact for {svc}: {v}."],
        "ask": ["Who do I email at Northwind about the {svc} integration?"],
        "noun": "the Northwind contact for {svc}",
    },
    {
        "id": "channel",
        "value": "channel",
        "state": ["Alerts for {svc} go to the Slack channel {v}."],
        "update": ["We renamed the {svc} alert channel, it's {v} now."],
        "ask": ["Where do the {svc} alerts get posted in Slack?"],
        "noun": "the Slack channel for {svc} alerts",
    },
    {
        "id": "freeze",
        "value": "date",
        "state": ["We decided to freeze {svc} deploys starting {v}."],
        "update": ["The {svc} deploy freeze got pushed, it now starts {v}."],
        "ask": ["From when are {svc} deploys frozen?"],
        "noun": "the date the {svc} deploy freeze starts",
    },
    {
        "id": "budget",
        "value": "amount",
        "state": ["Finance approved a monthly cloud budget of {v} for {svc}."],
        "update": ["The {svc} cloud budget was cut to {v} a month."],
        "ask": ["How much can {svc} spend on cloud per month?"],
        "noun": "the monthly cloud budget of {svc}",
    },
    {
        "id": "vault",
        "value": "word",
        "state": ["The break-glass credentials for {svc} are in the vault entry {v}."],
        "update": ["We re-keyed {svc}; the break-glass vault entry is {v} now."],
        "ask": ["In an emergency, which vault entry has the {svc} credentials?"],
        "noun": "the vault entry with the {svc} break-glass credentials",
    },
]
# Facts about the user, no service: the phrasing the memory agent's rules know ("my X is Y").
PERSONAL: list[dict[str, Any]] = [
    {
        "id": "pager",
        "value": "pager",
        "state": ["My on-call pager number is {v}, in case anything catches fire."],
        "update": ["My pager number changed, it's {v} now."],
        "ask": ["What number should you give people who need to page me?"],
        "noun": "my pager number",
    },
    {
        "id": "manager",
        "value": "person",
        "state": ["My manager is {v}, she signs off the change requests."],
        "update": ["Re-org news: my manager is {v} now."],
        "ask": ["Who approves my change requests?"],
        "noun": "my manager's name",
    },
]


@dataclass
class Fact:
    subject: str
    values: list[str]  # first value, then the changes
    statements: list[str]
    ask: str
    noun: str
    turns: list[tuple[int, int]] = field(default_factory=list)  # (conversation, exchange) per statement
    seqs: list[int] = field(default_factory=list)


@dataclass
class Question:
    kind: str  # single | two facts | changed
    text: str
    required: list[str]
    stale: list[str] = field(default_factory=list)


class _Planner:
    """Draws facts without repeating a subject or a value, and the turns they are stated in."""

    def __init__(self, rng: random.Random, conversations: int, turns: int) -> None:
        self.rng, self.turns, self.total = rng, turns, conversations * turns
        self.pool = [(s, svc) for s in SUBJECTS for svc in SERVICES] + [(s, None) for s in PERSONAL]
        rng.shuffle(self.pool)
        self.personal_left = {s["id"] for s in PERSONAL}
        self.used_values: set[str] = set()

    def value(self, kind: str) -> str:
        while True:
            v = VALUES[kind](self.rng)
            if v not in self.used_values:
                self.used_values.add(v)
                return v

    def fill(self, template: str, svc: str | None, v: str = "") -> str:
        return template.format(svc=svc or "", person=self.rng.choice(COLLEAGUES), v=v)

    def turn_at(self, position: int) -> tuple[int, int]:
        # Evidence turns spread over the whole history, never in the last exchanges before the questions.
        return divmod(min(position, self.total - 3), self.turns)

    def take(self, changed: bool) -> Fact:
        while True:
            subject, svc = self.pool.pop()
            if svc is None and subject["id"] not in self.personal_left:
                continue
            self.personal_left.discard(subject["id"])
            break
        values = [self.value(subject["value"])]
        statements = [self.fill(self.rng.choice(subject["state"]), svc, values[0])]
        if changed:
            values.append(self.value(subject["value"]))
            statements.append(self.fill(self.rng.choice(subject["update"]), svc, values[1]))
        return Fact(
            subject["id"],
            values,
            statements,
            self.fill(subject["ask"][0], svc),
            self.fill(subject["noun"], svc),
        )


_TWO_FACT_OPENERS = [
    "Before tonight's maintenance I need two things: {a}, and {b}. Can you remind me?",
    "Quick double check for the runbook: {a} and {b}?",
    "For the handover doc I'm missing {a} and also {b}.",
]


def plan(
    rng: random.Random, conversations: int, turns: int, counts: dict[str, int]
) -> tuple[list[Fact], list[Question]]:
    """The facts (with the turns they are stated in) and the questions."""
    p = _Planner(rng, conversations, turns)
    total = p.total
    facts: list[Fact] = []
    questions: list[Question] = []
    for _ in range(counts["single"]):
        fact = p.take(changed=False)
        fact.turns = [p.turn_at(rng.randrange(total - 3))]
        facts.append(fact)
        questions.append(Question("single", fact.ask, [fact.values[0]]))
    for _ in range(counts["changed"]):
        fact = p.take(changed=True)
        first = rng.randrange(total // 2)
        second = rng.randrange(first + turns // 3, total - 3)
        fact.turns = [p.turn_at(first), p.turn_at(second)]
        facts.append(fact)
        questions.append(Question("changed", fact.ask, [fact.values[1]], [fact.values[0]]))
    for _ in range(counts["two"]):
        a, b = p.take(changed=False), p.take(changed=False)
        for fact in (a, b):
            fact.turns = [p.turn_at(rng.randrange(total - 3))]
            facts.append(fact)
        text = rng.choice(_TWO_FACT_OPENERS).format(a=a.noun, b=b.noun)
        questions.append(Question("two facts", text[0].upper() + text[1:], [a.values[0], b.values[0]]))
    return facts, questions


# --- the history -------------------------------------------------------------------------------------------


# Said in passing about the same subjects, without a value: what makes finding the one message that holds the
# value harder than matching a service name.
DISTRACTORS = [
    "Did anyone check whether the {svc} deploy key still works on production?",
    "The {svc} database port is written down in the runbook somewhere, I think.",
    "I still don't know who really owns {svc}; the wiki page is out of date.",
    "We should clean up the old feature flags in {svc} at some point.",
    "The {svc} archive bucket is getting expensive, by the way.",
    "The jump host for {svc} was slow again this morning.",
    "Is there a ticket for the {svc} outage yet, or should I open one?",
    "Upgrading the {svc} SDK is on the list for next quarter.",
    "The partner API keeps throttling {svc} during the batch window.",
    "Northwind asked about the {svc} integration again.",
    "The {svc} alerts are too noisy, people mute the channel.",
    "Are we doing a deploy freeze for {svc} this year?",
    "The {svc} cloud bill went up again last month.",
    "Remind me to rotate the {svc} break-glass credentials.",
    "My pager went off twice last night for nothing.",
    "My manager wants the change requests earlier this week.",
]
COMMON_SERVICES = [
    "billing-api",
    "export-worker",
    "search-indexer",
    "auth-gateway",
    "report-builder",
    "ingest-queue",
]


def scripts(
    rng: random.Random, conversations: int, turns: int, facts: list[Fact], count: Any
) -> list[list[Any]]:
    """Filler exchanges per conversation, about the same services as the facts (bench/_common's service names
    are replaced by this benchmark's), one user message in six mentioning a fact's subject without its
    value, and each fact's statements put into the user message of its turn (after a line of the user's
    own, as people mention things in passing)."""

    def ours(text: str) -> str:
        for name in COMMON_SERVICES:
            while name in text:
                text = text.replace(name, rng.choice(SERVICES), 1)
        return text

    out = [
        conversation_script(
            rng,
            turns,
            count,
            tool_share=0.2,
            user_tokens=(40, 160),
            answer_tokens=(60, 220),
            tool_tokens=(60, 200),
        )
        for _ in range(conversations)
    ]
    for script in out:
        for exchange in script:
            exchange.question = ours(exchange.question)
            for reply in exchange.replies:
                reply["content"] = ours(reply["content"])
                reply["parts"] = json.loads(ours(json.dumps(reply["parts"])))
            if rng.random() < 1 / 6:
                distractor = rng.choice(DISTRACTORS).format(svc=rng.choice(SERVICES))
                exchange.question = f"{exchange.question} {distractor}"
    for fact in facts:
        for statement, (c, t) in zip(fact.statements, fact.turns, strict=True):
            exchange = out[c][t]
            first, _, rest = exchange.question.partition(". ")
            exchange.question = f"{first}. {statement} {rest}".strip() if rest else f"{statement} {first}"
    return out


def values_are_distinctive(facts: list[Fact], texts: list[str]) -> list[str]:
    """Values that also occur in text they were not planted in (a filler number, a name)."""
    planted = {s for f in facts for s in f.statements}
    others = "\n".join(t for t in texts if not any(s in t for s in planted))
    return [v for f in facts for v in f.values if v in others]


def build(
    tenant: Any, plans: list[list[Any]], facts: list[Fact], context_every: int
) -> tuple[list[Any], float]:
    """Append every exchange through the services, ask for the context as a client would (recorded, default
    budget: compaction runs as in production) and let the memory agent run after each completed exchange."""
    from context.pipeline import context_assemble
    from context.state import ContextRequest
    from conversations.services import conversation_create, message_append_batch

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


# --- the three prompts -----------------------------------------------------------------------------------


def mnemo_prompt(conversation: Any, question: str, budget: int) -> tuple[str, int, dict[str, str], float]:
    """(the prompt text, its tokens, text per block, milliseconds) of a dry-run context call."""
    from context.pipeline import context_assemble
    from context.serializers import context_payload
    from context.state import ContextRequest

    started = time.perf_counter()
    state = context_assemble(
        conversation=conversation, request=ContextRequest(question, token_budget=budget, record=False)
    )
    payload = context_payload(state)
    elapsed = (time.perf_counter() - started) * 1000
    text = payload["system"] + "\n" + json.dumps(payload["messages"], ensure_ascii=False)
    layout = state.layout
    blocks = {
        "B2a core memory": "\n".join(i.text for i in layout.b2a),
        "B4 summaries": "\n".join(i.text for i in layout.b4),
        "B6 history": "\n".join(m.content for m in layout.b6),
        "B5 memories": "\n".join(i.text for i in layout.b5 if i.source.get("kind") == "archival"),
        "B5 messages": "\n".join(i.text for i in layout.b5 if i.source.get("kind") != "archival"),
    }
    return text, state.tokens["total"], blocks, elapsed


def question_tokens(question: str) -> int:
    from providers.tokens import REPLY_PRIMING_TOKENS, count_message

    return count_message(role="user", content=question, model=MODEL) + REPLY_PRIMING_TOKENS


def recency_prompt(messages: list[tuple[str, int]], budget: int) -> tuple[str, int]:
    """The newest messages of the last conversation that fit the budget."""
    kept, used = [], 0
    for content, tokens in reversed(messages):
        if used + tokens > budget:
            break
        kept.append(content)
        used += tokens
    return "\n".join(kept), used


def bm25_prompt(question: str, corpus: list[tuple[str, int]], budget: int) -> tuple[str, int]:
    """The best BM25 hits over every message of the user's conversations, in rank order while they fit."""
    from memory.lexical import bm25_rank

    kept, used = [], 0
    for index, _ in bm25_rank(question, [c for c, _ in corpus]):
        content, tokens = corpus[index]
        if used + tokens <= budget:
            kept.append(content)
            used += tokens
        if budget - used < 20:
            break
    return "\n".join(kept), used


# --- the run -----------------------------------------------------------------------------------------------


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


def run(args: argparse.Namespace) -> tuple[str, bool]:
    from django.db import connection

    from conversations.models import Message
    from providers.embeddings import embedder_status
    from providers.tokens import count_text
    from tenants.services import tenant_create

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

    tenant, _ = tenant_create(slug=f"bench-recall-{args.seed}", name="bench recall")
    log(f"building {args.conversations} sessions of {args.turns} exchanges …")
    conversations, build_seconds = build(tenant, plans, facts, args.context_every)
    last = conversations[-1]
    end_user = last.end_user

    rows = Message.objects.filter(
        conversation__end_user=end_user,
        kind=Message.Kind.MESSAGE,
        role__in=[Message.Role.USER, Message.Role.ASSISTANT],
    ).exclude(content="")
    corpus = list(rows.values_list("content", "token_count"))
    recent = list(
        Message.objects.filter(conversation=last, kind=Message.Kind.MESSAGE)
        .order_by("seq")
        .values_list("content", "token_count")
    )
    stats = {
        "messages": Message.objects.filter(
            conversation__end_user=end_user, kind=Message.Kind.MESSAGE
        ).count(),
        "tokens": sum(
            Message.objects.filter(conversation__end_user=end_user, kind=Message.Kind.MESSAGE).values_list(
                "token_count", flat=True
            )
        ),
        "memories": end_user.archival_memories.filter(invalidated_at__isnull=True).count(),
        "segments": sum(c.summary_segments.count() for c in conversations),
    }

    systems = ("Mnemo", "recency window", "plain BM25")
    scores = {(s, b): Score() for s in systems for b in BUDGETS}
    by_kind = {(k, b): Score() for k in ("single", "two facts", "changed") for b in BUDGETS}
    blocks_found: dict[str, int] = {}
    latencies: dict[int, list[float]] = {b: [] for b in BUDGETS}
    log(f"asking {len(questions)} questions at {', '.join(f'{b:,}' for b in BUDGETS)} tokens …")
    for question in questions:
        own = question_tokens(question.text)
        for budget in BUDGETS:
            text, tokens, blocks, ms = mnemo_prompt(last, question.text, budget)
            latencies[budget].append(ms)
            scores[("Mnemo", budget)].add(question, text, tokens)
            by_kind[(question.kind, budget)].add(question, text, tokens)
            if budget == TARGET_BUDGET:
                for value in question.required:
                    where = [name for name, block in blocks.items() if value in block]
                    key = " + ".join(where) if where else ("elsewhere" if value in text else "missing")
                    blocks_found[key] = blocks_found.get(key, 0) + 1
            text, tokens = recency_prompt(recent, budget - own)
            scores[("recency window", budget)].add(question, text, tokens + own)
            text, tokens = bm25_prompt(question.text, corpus, budget - own)
            scores[("plain BM25", budget)].add(question, text, tokens + own)

    status = embedder_status()
    embeddings = status.embedder.name if status.embedder else "none (lexical retrieval only)"
    database = f"{connection.vendor} ({'throwaway database' if args.pg else 'embedded, temporary'})"
    kinds = {k: sum(q.kind == k for q in questions) for k in ("single", "two facts", "changed")}
    header = machine_header(
        "bench/recall.py",
        f"{args.conversations} sessions x {args.turns} exchanges of one end user, "
        f"{stats['messages']:,} messages, {stats['tokens']:,} tokens; {len(facts)} planted facts; "
        f"questions: {kinds['single']} single, {kinds['two facts']} two-fact, {kinds['changed']} changed; "
        f"seed {args.seed}",
        f"built in {build_seconds:.0f}s through the services: context call every {args.context_every} "
        "exchange(s) (default budget, recorded: compaction as in production, offline extractive "
        f"summariser), memory agent after each exchange (rules): {stats['memories']} live archival "
        f"memories, {stats['segments']} summary segments written",
        f"database {database}; embeddings {embeddings}; model {MODEL}; no agent profile (B1)",
    )

    head = [
        "system",
        *[f"recall @ {b // 1000}k" for b in BUDGETS],
        *[f"tokens @ {b // 1000}k" for b in BUDGETS],
        "stale only (changed)",
    ]
    table = []
    for system in systems:
        cells = [system]
        cells += [f"{scores[(system, b)].recall:.2f}" for b in BUDGETS]
        cells += [f"{statistics.fmean(scores[(system, b)].tokens):,.0f}" for b in BUDGETS]
        stale = scores[(system, TARGET_BUDGET)]
        cells.append(f"{stale.stale_only}/{stale.changed} @ 2k")
        table.append(cells)
    kind_rows = [
        [f"Mnemo, {kind}", *[f"{by_kind[(kind, b)].recall:.2f}" for b in BUDGETS]]
        for kind in ("single", "two facts", "changed")
        if kinds[kind]
    ]
    kind_table = render_table(["questions", *[f"recall @ {b // 1000}k" for b in BUDGETS]], kind_rows)
    found_rows = [[k, str(v)] for k, v in sorted(blocks_found.items(), key=lambda kv: -kv[1])]
    found_table = render_table(["where Mnemo's prompt held each required value @ 2k", "values"], found_rows)
    latency_rows = [
        [f"{b:,}", f"{percentile(latencies[b], 50):.1f}", f"{percentile(latencies[b], 99):.1f}"]
        for b in BUDGETS
    ]
    latency_table = render_table(["budget", "context call p50 ms", "p99 ms"], latency_rows)

    mnemo = scores[("Mnemo", TARGET_BUDGET)].recall
    window = scores[("recency window", TARGET_BUDGET)].recall
    ratio = mnemo / window if window else float("inf")
    met = mnemo >= TARGET_RECALL and ratio >= TARGET_RATIO
    verdict = render_table(
        ["target", "measured", "verdict"],
        [
            [
                f"@ 2k: Mnemo >= {TARGET_RECALL} and >= {TARGET_RATIO:.0f}x the recency window",
                f"{mnemo:.2f}, {'inf' if window == 0 else f'{ratio:.1f}'}x ({window:.2f})",
                "met" if met else "MISSED",
            ]
        ],
    )
    text = "\n\n".join(
        [header + "\n" + render_table(head, table), kind_table, found_table, latency_table, verdict]
    )
    return text, met


def main() -> int:
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
    # Every dry-run call logs the degradations this set-up has on purpose (no LLM, maybe no embeddings); the
    # header states them once.
    os.environ.setdefault("MNEMO_LOG_LEVEL", "ERROR")
    started = time.perf_counter()
    with scratch_dir("mnemo-bench-recall-") as scratch:
        if args.pg:
            from bench.context_latency import throwaway_database

            with throwaway_database(args.pg_url) as url:
                django_setup(var_dir=Path(scratch), database_url=url)
                text, met = run(args)
        else:
            django_setup(var_dir=Path(scratch))
            text, met = run(args)
    print(text)
    log(f"run took {time.perf_counter() - started:.0f}s")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
