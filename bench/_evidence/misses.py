"""Where the evidence goes missing: every question asked again in-process on a copy of a kept load, each
missing evidence message found among B5's ranked candidates or not.

Imported once django_setup() has run: it imports the apps at module level.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Any

from bench._common import log, render_table
from bench._evidence.dataset import Dataset
from bench._evidence.scoring import Prompt, words
from context.pipeline import context_assemble
from context.serializers import context_payload
from context.state import ContextRequest
from conversations.models import Conversation
from prefix_cache.provenance import MessageSource

BLOCKS = ("B1", "B2a", "B2b", "B3", "B4", "B5", "B6")


def mnemo_seqs(conversation: dict[str, Any]) -> dict[int, int]:
    """Dataset seq -> Mnemo seq: evidence_recall.py appends the messages in seq order, and Mnemo numbers a
    conversation's messages from 1."""
    ordered = sorted(m["seq"] for m in conversation["messages"])
    return {seq: position + 1 for position, seq in enumerate(ordered)}


def ask(conversation_row: Any, question: dict[str, Any], budget: int) -> tuple[dict[str, Any], list[int]]:
    """The response body and the Mnemo seqs of B5's message candidates, best first."""
    request = ContextRequest(
        user_message=question["question"], token_budget=budget, format="openai", record=False
    )
    state = context_assemble(conversation=conversation_row, request=request)
    ranked = [i.source.seq for i in state.candidates if isinstance(i.source, MessageSource)]
    return context_payload(state), ranked


def diagnose(conversation: dict[str, Any], conversation_row: Any, budget: int) -> list[dict[str, Any]]:
    texts = {m["seq"]: m["content"] for m in conversation["messages"]}
    roles = {m["seq"]: m["role"] for m in conversation["messages"]}
    to_mnemo = mnemo_seqs(conversation)
    rows = []
    for question in conversation["questions"]:
        response, ranked = ask(conversation_row, question, budget)
        prompt = Prompt.of(response)
        evidence = list(question.get("evidence_seqs") or [])
        present = [s for s in evidence if prompt.holds(words(texts.get(s, "")))]
        missing = []
        for seq in evidence:
            if seq not in present:
                at = to_mnemo.get(seq)
                rank = ranked.index(at) if at in ranked else None
                missing.append({"seq": seq, "role": roles.get(seq), "rank": rank})
        blocks = response.get("blocks") or {}
        rows.append(
            {
                "conversation": conversation["id"],
                "id": question["id"],
                "category": question["category"],
                "budget": budget,
                "er": len(present) / len(evidence) if question.get("scored") and evidence else None,
                "evidence": evidence,
                "present": present,
                "missing": missing,
                "blocks": {b: (blocks.get(b) or {}).get("tokens", 0) for b in BLOCKS},
            }
        )
    return rows


def category_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    by_category: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_category[row["category"]].append(row)
    out = []
    for category, group in [*sorted(by_category.items()), ("overall", rows)]:
        missing = [m for r in group for m in r["missing"]]
        ranks = [m["rank"] for m in missing if m["rank"] is not None]
        out.append(
            [
                category,
                str(len(group)),
                f"{statistics.fmean(r['er'] for r in group):.3f}",
                str(sum(len(r["evidence"]) for r in group)),
                str(len(missing)),
                str(len(ranks)),
                f"{statistics.median(ranks):.0f}" if ranks else "-",
                str(len(missing) - len(ranks)),
                str(sum(m["role"] == "user" for m in missing)),
            ]
        )
    return out


def report(rows: list[dict[str, Any]], budgets: list[int]) -> str:
    head = ["category", "n", "ER", "evidence", "missing", "ranked, not fitted", "median rank",
            "not a candidate", "missing from the user"]  # fmt: skip
    parts = []
    for budget in budgets:
        scored = [r for r in rows if r["budget"] == budget and r["er"] is not None]
        parts.append(f"\nat {budget:,} tokens:\n" + render_table(head, category_rows(scored)))
        means = {b: statistics.fmean(r["blocks"][b] for r in scored) for b in BLOCKS}
        parts.append("mean tokens per block: " + ", ".join(f"{b} {v:,.0f}" for b, v in means.items()))
    return "\n".join(parts)


def diagnose_all(dataset: Dataset, manifest: dict[str, Any], budgets: list[int]) -> list[dict[str, Any]]:
    """Every conversation of the data at every budget the kept load holds."""
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for conversation in dataset.conversations:
        ids = manifest["conversations"].get(conversation["id"]) or {}
        for budget in budgets:
            if str(budget) not in ids:
                log(f"  {conversation['id']} @ {budget}: not in the load, skipped")
                continue
            row = Conversation.objects.select_related("tenant").get(pk=ids[str(budget)])
            rows += diagnose(conversation, row, budget)
        log(f"  {conversation['id']} asked ({time.perf_counter() - started:.0f}s)")
    return rows
