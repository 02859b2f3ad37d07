"""Where the evidence went that a context call missed: the diagnosis next to bench/evidence_recall.py's score.

On a load that bench/evidence_recall.py kept (--var-dir DIR --keep; the SQLite embedded server's var dir),
every question is asked again in this process, on a copy of the load (the kept one is not touched), through
the same pipeline the API runs (context_assemble, nothing recorded). ER is scored as evidence_recall.py
scores it, and each evidence message the prompt lacks is classed:

- ranked, not fitted: among B5's candidates (this conversation's message hits and their exchange partners,
  best first), but the budget ran out before it (its rank among them is reported);
- not a candidate: the retrieval never offered it (not ranked high enough, below the relevance floor).

So a change can be aimed: more room or cheaper items for the first kind, a better ranking for the second.
Also reported: the mean tokens of each block, i.e. where the budget went.

Run from the repository root, after a kept load:
  .venv/bin/python bench/evidence_recall.py --var-dir DIR --keep
  .venv/bin/python bench/evidence_misses.py --var-dir DIR [--budgets 2000,8000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import django_setup, log, machine_header, render_table
from bench.evidence_recall import DEFAULT_DATA, MANIFEST, Prompt, read_dataset, words

BLOCKS = ("B1", "B2a", "B2b", "B3", "B4", "B5", "B6")


def mnemo_seqs(conversation: dict[str, Any]) -> dict[int, int]:
    """Dataset seq -> Mnemo seq: evidence_recall.py appends the messages in seq order, and Mnemo numbers a
    conversation's messages from 1."""
    ordered = sorted(m["seq"] for m in conversation["messages"])
    return {seq: position + 1 for position, seq in enumerate(ordered)}


def ask(conversation_row: Any, question: dict[str, Any], budget: int) -> tuple[dict[str, Any], list[int]]:
    """The response body and the Mnemo seqs of B5's message candidates, best first."""
    from context.pipeline import context_assemble
    from context.serializers import context_payload
    from context.state import ContextRequest

    request = ContextRequest(
        user_message=question["question"], token_budget=budget, format="openai", record=False
    )
    state = context_assemble(conversation=conversation_row, request=request)
    ranked = [int(i.source["seq"]) for i in state.candidates if i.source.get("kind") == "message"]
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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--var-dir", type=Path, required=True, help="a load evidence_recall.py kept")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--budgets", default="2000,8000")
    parser.add_argument("--json", type=Path, help="write per-question results here")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    manifest_path = args.var_dir / MANIFEST
    if not manifest_path.exists():
        sys.exit(f"{manifest_path} not found: load with bench/evidence_recall.py --var-dir DIR --keep first")
    manifest = json.loads(manifest_path.read_text())
    budgets = [int(b) for b in args.budgets.split(",")]
    dataset = read_dataset(args.data, None, None)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mnemo-evidence-misses-") as scratch:
        copy = Path(scratch) / "var"
        shutil.copytree(args.var_dir, copy)
        django_setup(var_dir=copy)
        from conversations.models import Conversation

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
    print(machine_header("bench/evidence_misses.py"))
    print(f"# load {args.var_dir}, data {args.data}; in-process context_assemble on a copy, nothing recorded")
    print(report(rows, budgets))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
