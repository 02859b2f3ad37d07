"""The evidence benchmark's header and tables: ER per method, budget and category, latency, abstention,
degradations."""

from __future__ import annotations

import argparse
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import machine_header, percentile, render_table
from bench._evidence.api import Limits
from bench._evidence.dataset import Dataset, truncation_notes
from bench._evidence.loading import Load
from bench._evidence.service import Service


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


@dataclass
class Scores:
    """ER per (method, budget, category); "*" is the macro over questions, "all" the all-evidence share."""

    er: dict[tuple[str, int, str], float]
    categories: list[str]
    n: dict[str, int]


def scores(rows: list[dict[str, Any]], base_er: Any, base_full: Any, budgets: list[int]) -> Scores:
    scored = [r for r in rows if r["er"] is not None]
    categories = sorted({r["category"] for r in scored})
    er: dict[tuple[str, int, str], float] = {}
    for b in budgets:
        mine = [r for r in scored if r["budget"] == b]
        for cat in categories:
            er[("Mnemo", b, cat)] = mean([r["er"] for r in mine if r["category"] == cat])
        er[("Mnemo", b, "*")] = mean([r["er"] for r in mine])
        er[("Mnemo", b, "all")] = mean([float(r["er"] == 1.0) for r in mine])
        for method in ("recency", "bm25", "oracle"):
            for cat in categories:
                er[(method, b, cat)] = mean(base_er[method][b][cat])
            er[(method, b, "*")] = mean([x for v in base_er[method][b].values() for x in v])
            er[(method, b, "all")] = mean([float(x) for x in base_full[method][b]])
    n = Counter(r["category"] for r in scored if r["budget"] == budgets[0])
    return Scores(er, categories, {**n, "*": sum(n.values())})


def er_table(s: Scores, budgets: list[int]) -> str:
    methods = (("Mnemo", "Mnemo"), ("recency", "recency"), ("bm25", "BM25"))
    head = ["category", "n", *[f"{label}@{b}" for b in budgets for _, label in methods]]
    labels = [(c, c) for c in s.categories]
    labels += [("*", "overall (macro over questions)"), ("all", "all evidence included (share)")]
    rows = [
        [
            label,
            str(s.n.get(key, s.n["*"])),
            *[f"{s.er[(m, b, key)]:.3f}" for b in budgets for m, _ in methods],
        ]
        for key, label in labels
    ]
    ceiling = [f"{s.er[('oracle', b, '*')]:.3f}" for b in budgets for _ in methods]
    rows.append(["ceiling: oracle (the evidence alone), overall", str(s.n["*"]), *ceiling])
    return render_table(head, rows)


def margin_table(s: Scores, budgets: list[int]) -> str:
    rows = []
    for b in budgets:
        mine, bm25 = s.er[("Mnemo", b, "*")], s.er[("bm25", b, "*")]
        ratio = f"{mine / bm25:.2f}" if bm25 else "-"
        rows.append([f"{b:,}", f"{mine:.3f}", f"{bm25:.3f}", f"{mine - bm25:+.3f}", ratio])
    return render_table(["budget", "Mnemo ER", "BM25 ER (baseline)", "Mnemo - BM25", "ratio"], rows)


def latency_table(rows: list[dict[str, Any]], budgets: list[int]) -> str:
    out = []
    for b in budgets:
        ok = [r for r in rows if r["budget"] == b and "error" not in r]
        client, server = [r["latency_ms"] for r in ok], [r["server_ms"] for r in ok]
        tokens = [r["tokens_total"] or 0 for r in ok]
        failed = sum(1 for r in rows if r["budget"] == b and "error" in r)
        out.append(
            [f"{b:,}", f"{len(ok)} (+{failed} failed)" if failed else str(len(ok))]
            + [f"{percentile(client, p):.1f}" for p in (50, 95, 100)]
            + [f"{percentile(server, p):.1f}" for p in (50, 95, 100)]
            + [f"{mean(tokens):,.0f}", f"{max(tokens, default=0):,}", str(sum(1 for t in tokens if t > b))]
        )
    head = [
        "budget",
        "calls",
        "client p50 ms",
        "p95 ms",
        "max ms",
        "server timings p50 ms",
        "p95 ms",
        "max ms",
    ]
    return render_table([*head, "tokens.total mean", "max", "calls over budget"], out)


def b5_row(label: str, rows: list[dict[str, Any]], budget: int) -> list[str]:
    tokens = [r["b5_tokens"] for r in rows]
    tops = [max(r["b5_scores"]) for r in rows if r["b5_scores"]]
    return [
        label,
        f"{budget:,}",
        str(len(rows)),
        f"{mean(tokens):,.0f}" if tokens else "-",
        f"{percentile(tokens, 90):,}" if tokens else "-",
        str(sum(1 for t in tokens if t)),
        f"{mean(tops):.3f}" if tops else "- (no scores)",
    ]


def abstention_table(rows: list[dict[str, Any]], budgets: list[int]) -> str:
    out = []
    for b in budgets:
        ok = [r for r in rows if r["budget"] == b and "error" not in r]
        out.append(
            b5_row("abstention (nothing to find)", [r for r in ok if r["category"] == "abstention"], b)
        )
        out.append(b5_row("scored questions", [r for r in ok if r["er"] is not None], b))
    head = ["questions", "budget", "calls", "B5 tokens mean", "p90", "calls with B5", "top B5 score mean"]
    return render_table(head, out)


def degradation_table(rows: list[dict[str, Any]], budgets: list[int]) -> str:
    """Calls per degradation code and per dropped block: nothing the server gave up is silent here."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        for code in set(r.get("degradations") or []):
            counts[f"degradation {code}"][r["budget"]] += 1
        for d in {(d["block"], d["reason"]) for d in r.get("dropped") or []}:
            counts[f"dropped {d[0]} ({d[1]})"][r["budget"]] += 1
    if not counts:
        return "no degradations, nothing dropped"
    body = [[k, *[str(counts[k][b]) for b in budgets]] for k in sorted(counts)]
    return render_table(["calls with", *[f"@{b:,}" for b in budgets]], body)


def header(dataset: Dataset, service: Service, load: Load, args: argparse.Namespace, base: Path) -> str:
    convs = dataset.conversations
    messages = sum(len(c["messages"]) for c in convs)
    tokens = sum((len(m["content"]) + 3) // 4 for c in convs for m in c["messages"])
    questions = [q for c in convs for q in c["questions"]]
    scored = sum(1 for q in questions if q.get("scored"))
    abstention = sum(1 for q in questions if q["category"] == "abstention")
    limit = Limits().message_bytes
    notes = truncation_notes(dataset, limit)
    lines = [
        f"data {dataset.path} sha256 {dataset.sha256}",
        f"{len(convs)} of {dataset.total} conversations ({', '.join(c['id'] for c in convs)}): {messages:,} "
        f"messages, {tokens:,} tokens (len/4); {len(questions)} questions asked per budget, {scored} scored, "
        f"{abstention} abstention; budgets {', '.join(f'{b:,}' for b in args.budgets)}",
        *[f"TRUNCATED to MNEMO_MAX_MESSAGE_BYTES: {n}" for n in notes],
        service.describe,
        load_line(load, len(convs) * len(args.budgets)),
        load.index_note,
        *load.warnings,
        f"baselines: {base} (recency, bm25, oracle; len/4 tokens; the untruncated messages), same questions",
    ]
    return machine_header("bench/evidence_recall.py", *lines)


def load_line(load: Load, pairs: int) -> str:
    if load.skipped == pairs:
        return f"loading skipped: all {pairs} conversation x budget pairs were in the kept load (--var-dir)"
    rate = load.messages / load.seconds if load.seconds else 0.0
    kept = f" ({load.skipped} pairs already kept)" if load.skipped else ""
    return (
        f"loaded {pairs - load.skipped} conversation x budget pairs{kept}: {load.messages:,} messages in "
        f"{load.requests} batches of <= {Limits().batch} in {load.seconds:.1f}s = {rate:,.0f} appends/s; "
        f"index wait {load.index_seconds:.1f}s"
    )
