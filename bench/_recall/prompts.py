"""The three prompts a question is scored on: Mnemo's dry-run context call, the recency window, plain BM25."""

from __future__ import annotations

import json
import time
from typing import Any

from bench._common import MODEL
from context.pipeline import context_assemble
from context.serializers import context_payload
from context.state import ContextRequest
from prefix_cache.provenance import ArchivalSource
from providers.tokens import REPLY_PRIMING_TOKENS, count_message
from retrieval.lexical import bm25_rank


def mnemo_prompt(conversation: Any, question: str, budget: int) -> tuple[str, int, dict[str, str], float]:
    """(the prompt text, its tokens, text per block, milliseconds) of a dry-run context call."""
    started = time.perf_counter()
    state = context_assemble(
        conversation=conversation, request=ContextRequest(question, token_budget=budget, record=False)
    )
    payload = context_payload(state)
    elapsed = (time.perf_counter() - started) * 1000
    text = payload["system"] + "\n" + json.dumps(payload["messages"], ensure_ascii=False)
    layout = state.layout
    memories = [i for i in layout.retrieved if isinstance(i.source, ArchivalSource)]
    messages = [i for i in layout.retrieved if not isinstance(i.source, ArchivalSource)]
    blocks = {
        "B2a core memory": "\n".join(i.text for i in layout.core_memory),
        "B4 summaries": "\n".join(i.text for i in layout.summaries),
        "B6 history": "\n".join(m.content for m in layout.history),
        "B5 memories": "\n".join(i.text for i in memories),
        "B5 messages": "\n".join(i.text for i in messages),
    }
    return text, state.tokens["total"], blocks, elapsed


def question_tokens(question: str) -> int:
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
    kept, used = [], 0
    for index, _ in bm25_rank(question, [c for c, _ in corpus]):
        content, tokens = corpus[index]
        if used + tokens <= budget:
            kept.append(content)
            used += tokens
        if budget - used < 20:
            break
    return "\n".join(kept), used
