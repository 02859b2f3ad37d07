"""Where each fact is said and asked: the plan of statements and questions, and the sessions' scripts around
them."""

from __future__ import annotations

import json
import random
from typing import Any

from bench._common import SERVICES as FILLER_SERVICES
from bench._common import conversation_script
from bench._recall.facts import COLLEAGUES, PERSONAL, SERVICES, SUBJECTS, VALUES, Fact, Question


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


def scripts(
    rng: random.Random, conversations: int, turns: int, facts: list[Fact], count: Any
) -> list[list[Any]]:
    """Filler exchanges per conversation, about the same services as the facts (bench/_common's service names
    are replaced by this benchmark's), one user message in six mentioning a fact's subject without its
    value, and each fact's statements put into the user message of its turn (after a line of the user's
    own, as people mention things in passing)."""

    def ours(text: str) -> str:
        for name in FILLER_SERVICES:
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
