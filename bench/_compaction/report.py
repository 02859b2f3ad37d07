"""The compaction table: facts kept and tokens saved, each against its baseline."""

from __future__ import annotations

import argparse
import statistics

from bench._common import machine_header, render_table

TARGET_FACTS = 0.95
TARGET_SAVING = 0.70


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "∞"


def table(result: dict, args: argparse.Namespace) -> str:
    mnemo = result["mnemo"]
    saving = 1 - result["after"] / result["before"]
    rows = [*_fact_rows(result["mnemo"], result["baseline"]), *_token_rows(result)]
    head = ("metric", "Mnemo", "summary-of-summary", "ratio")
    lines = [
        machine_header(
            "bench/compaction.py",
            f"{args.messages} messages, {args.compactions} compactions, offline extractive summariser, "
            f"seed {args.seed}",
        ),
        render_table(head, rows),
        "",
        f"Mnemo after: {result['segments']} live segment(s) + {result['b6_messages']} verbatim messages; "
        f"fact check: {result['facts_missing']} of {result['facts_checked']} facts re-added.",
        f"Targets: ≥ {TARGET_FACTS:.0%} facts kept → {'met' if mnemo['all'] >= TARGET_FACTS else 'MISSED'}; "
        f"≥ {TARGET_SAVING:.0%} fewer tokens → {'met' if saving >= TARGET_SAVING else 'MISSED'}.",
    ]
    return "\n".join(lines)


def _fact_rows(mnemo: dict, base: dict) -> list[tuple[str, str, str, str]]:
    """Planted facts kept, in all and by kind, against summary-of-summary."""
    kinds = [
        ("planted facts kept in B4 + B6", "all"),
        ("· numbers (25)", "number"),
        ("· file paths (25)", "path"),
        ("· names (25)", "name"),
        ("· decisions (25)", "decision"),
    ]
    return [(label, _pct(mnemo[k]), _pct(base[k]), _ratio(mnemo[k], base[k])) for label, k in kinds]


def _token_rows(result: dict) -> list[tuple[str, str, str, str]]:
    """Prompt tokens before and after, and the compactions' time."""
    saving = 1 - result["after"] / result["before"]
    base_saving = 1 - result["baseline_after"] / result["before"]
    return [
        ("prompt tokens before (no compaction)", f"{result['before']:,}", f"{result['before']:,}", "1.00×"),
        (
            "prompt tokens after",
            f"{result['after']:,}",
            f"{result['baseline_after']:,}",
            _ratio(result["after"], result["baseline_after"]),
        ),
        ("fewer prompt tokens", _pct(saving), _pct(base_saving), _ratio(saving, base_saving)),
        (
            "compaction time, mean / max (ms)",
            f"{statistics.mean(result['times']):.0f} / {max(result['times']):.0f}",
            "—",
            "",
        ),
    ]
