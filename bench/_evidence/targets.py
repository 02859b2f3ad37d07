"""The evidence benchmark's targets and their verdicts."""

from __future__ import annotations

from typing import Any

from bench._common import render_table
from bench._evidence.report import Scores

TARGET_ER_2K = 0.75


TARGET_MARGIN_2K = 0.20


TARGET_ER_8K = 0.90


TARGET_MAX_MS = 250.0


def verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "MISSED")


def category_target(s: Scores, b: int, budgets: list[int]) -> list[str]:
    name = f"no category below BM25 @{b:,}"
    if b not in budgets:
        return [name, "-", verdict(None)]
    below = [c for c in s.categories if s.er[("Mnemo", b, c)] < s.er[("bm25", b, c)] - 1e-9]
    detail = ", ".join(f"{c} {s.er[('Mnemo', b, c)]:.3f} < {s.er[('bm25', b, c)]:.3f}" for c in below)
    measured = (
        f"{len(below)} of {len(s.categories)} below: {detail}" if below else f"none of {len(s.categories)}"
    )
    return [name, measured, verdict(not below)]


def er_target(s: Scores, budgets: list[int], budget: int, floor: float, name: str, bm25: bool) -> list[str]:
    """ER@budget >= floor (plus BM25's ER at that budget when `bm25`)."""
    if budget not in budgets:
        return [name, "-", verdict(None)]
    mine = s.er[("Mnemo", budget, "*")]
    need = floor + (s.er[("bm25", budget, "*")] if bm25 else 0.0)
    measured = f"{mine:.3f} (needs {need:.3f})"
    return [name, measured, verdict(mine >= need)]


def targets(s: Scores, rows: list[dict[str, Any]], budgets: list[int]) -> tuple[str, bool]:
    ok = [r for r in rows if "error" not in r]
    slowest = max((r["latency_ms"] for r in ok), default=0.0)
    slow = sum(1 for r in ok if r["latency_ms"] > TARGET_MAX_MS)
    failed = len(rows) - len(ok)
    table = [
        er_target(s, budgets, 2000, TARGET_ER_2K, f"ER@2000 >= {TARGET_ER_2K} overall", bm25=False),
        er_target(
            s, budgets, 2000, TARGET_MARGIN_2K, f"ER@2000 >= BM25@2000 + {TARGET_MARGIN_2K}", bm25=True
        ),
        er_target(s, budgets, 8000, TARGET_ER_8K, f"ER@8000 >= {TARGET_ER_8K} overall", bm25=False),
        category_target(s, 2000, budgets),
        category_target(s, 8000, budgets),
        [
            f"no context call over {TARGET_MAX_MS:.0f} ms (client side)",
            f"max {slowest:.1f} ms; {slow} of {len(ok)} calls over",
            verdict(slow == 0),
        ],
        ["every context call answered", f"{failed} failed of {len(rows)}", verdict(failed == 0)],
    ]
    return render_table(["target", "measured", "verdict"], table), all(r[2] != "MISSED" for r in table)
