"""The two layouts compared: Mnemo's context pipeline turn by turn, and a naive window under a system prompt
with a clock.

Imported once django_setup() has run: it imports the apps at module level.
"""

from __future__ import annotations

import random
import re
import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from bench._common import (
    MODEL,
    Exchange,
    log,
)
from bench._prefix_cache.tokens import PromptTokenizer
from context.pipeline import context_assemble
from context.serializers import context_payload
from context.state import ContextRequest
from conversations.services import conversation_create, message_append_batch
from prefix_cache.rendering import HistoryMessage, render_history


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
