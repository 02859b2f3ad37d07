"""The recall benchmark's header and tables: recall per system, per kind of question, where the values were
found, the context call's time, and the target's verdict."""

from __future__ import annotations

import argparse
import statistics

from django.db import connection

from bench._common import MODEL, machine_header, percentile, render_table
from bench._recall.facts import Fact, Question
from bench._recall.run import BUDGETS, KINDS, SYSTEMS, TARGET_BUDGET, Built, Results
from providers.embeddings import embedder_status

TARGET_RECALL = 0.85
TARGET_RATIO = 2.0


def header(args: argparse.Namespace, facts: list[Fact], questions: list[Question], history: Built) -> str:
    stats = history.stats
    status = embedder_status()
    embeddings = status.embedder.name if status.embedder else "none (lexical retrieval only)"
    database = f"{connection.vendor} ({'throwaway database' if args.pg else 'embedded, temporary'})"
    kinds = {k: sum(q.kind == k for q in questions) for k in KINDS}
    return machine_header(
        "bench/recall.py",
        f"{args.conversations} sessions x {args.turns} exchanges of one end user, "
        f"{stats['messages']:,} messages, {stats['tokens']:,} tokens; {len(facts)} planted facts; "
        f"questions: {kinds['single']} single, {kinds['two facts']} two-fact, {kinds['changed']} changed; "
        f"seed {args.seed}",
        f"built in {history.seconds:.0f}s through the services: context call every {args.context_every} "
        "exchange(s) (default budget, recorded: compaction as in production, offline extractive "
        f"summariser), memory agent after each exchange (rules): {stats['memories']} live archival "
        f"memories, {stats['segments']} summary segments written",
        f"database {database}; embeddings {embeddings}; model {MODEL}; no agent profile (B1)",
    )


def systems_table(results: Results) -> str:
    head = [
        "system",
        *[f"recall @ {b // 1000}k" for b in BUDGETS],
        *[f"tokens @ {b // 1000}k" for b in BUDGETS],
        "stale only (changed)",
    ]
    table = []
    for system in SYSTEMS:
        cells = [system]
        cells += [f"{results.scores[(system, b)].recall:.2f}" for b in BUDGETS]
        cells += [f"{statistics.fmean(results.scores[(system, b)].tokens):,.0f}" for b in BUDGETS]
        stale = results.scores[(system, TARGET_BUDGET)]
        cells.append(f"{stale.stale_only}/{stale.changed} @ 2k")
        table.append(cells)
    return render_table(head, table)


def detail_tables(questions: list[Question], results: Results) -> list[str]:
    kinds = {k: sum(q.kind == k for q in questions) for k in KINDS}
    kind_rows = [
        [f"Mnemo, {kind}", *[f"{results.by_kind[(kind, b)].recall:.2f}" for b in BUDGETS]]
        for kind in KINDS
        if kinds[kind]
    ]
    kind_table = render_table(["questions", *[f"recall @ {b // 1000}k" for b in BUDGETS]], kind_rows)
    found_rows = [[k, str(v)] for k, v in sorted(results.blocks_found.items(), key=lambda kv: -kv[1])]
    found_table = render_table(["where Mnemo's prompt held each required value @ 2k", "values"], found_rows)
    latencies = results.latencies
    latency_rows = [
        [f"{b:,}", f"{percentile(latencies[b], 50):.1f}", f"{percentile(latencies[b], 99):.1f}"]
        for b in BUDGETS
    ]
    latency_table = render_table(["budget", "context call p50 ms", "p99 ms"], latency_rows)
    return [kind_table, found_table, latency_table]


def verdict(results: Results) -> tuple[str, bool]:
    mnemo = results.scores[("Mnemo", TARGET_BUDGET)].recall
    window = results.scores[("recency window", TARGET_BUDGET)].recall
    ratio = mnemo / window if window else float("inf")
    met = mnemo >= TARGET_RECALL and ratio >= TARGET_RATIO
    table = render_table(
        ["target", "measured", "verdict"],
        [
            [
                f"@ 2k: Mnemo >= {TARGET_RECALL} and >= {TARGET_RATIO:.0f}x the recency window",
                f"{mnemo:.2f}, {'inf' if window == 0 else f'{ratio:.1f}'}x ({window:.2f})",
                "met" if met else "MISSED",
            ]
        ],
    )
    return table, met


def report(
    args: argparse.Namespace, facts: list[Fact], questions: list[Question], history: Built, results: Results
) -> tuple[str, bool]:
    verdict_table, met = verdict(results)
    first = header(args, facts, questions, history) + "\n" + systems_table(results)
    return "\n\n".join([first, *detail_tables(questions, results), verdict_table]), met
