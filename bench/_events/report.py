"""The events table: each publisher's cost per append against the plain call on the same layer."""

from __future__ import annotations

import argparse
from typing import Any

from bench._common import machine_header, percentile, render_table

WARMUP = 20


def report(
    args: argparse.Namespace,
    bare: dict[str, Any],
    results: dict[tuple[str, str], dict[str, Any]],
    *,
    load: tuple[float, float],
) -> str:
    head = [
        "layer",
        "publisher",
        "publish µs p50",
        "publish µs p95",
        "append ms p50",
        "all sent ms",
        "delivered",
        "publish p50: plain / this",
    ]
    rows = [["none", "(no publish)", "-", "-", f"{percentile(bare['append'], 50) * 1000:.2f}", "-", "-", "-"]]
    for (layer, publisher), r in results.items():
        baseline = percentile(results[layer, "plain"]["publish"], 50)
        p50 = percentile(r["publish"], 50)
        rows.append(
            [
                layer,
                publisher + (" (baseline)" if publisher == "plain" else ""),
                f"{p50 * 1e6:,.0f}",
                f"{percentile(r['publish'], 95) * 1e6:,.0f}",
                f"{percentile(r['append'], 50) * 1000:.2f}",
                f"{r['all_sent'] * 1000:,.0f}",
                f"{r['delivered']}/{len(r['publish'])}",
                f"{baseline / p50:.1f}x",
            ]
        )
    header = machine_header(
        "bench/events.py",
        f"{args.appends} appends a row (+{WARMUP} warm-up), one event each; SQLite; redis {args.redis_url}",
        f"1-minute load average {load[0]:.1f} before, {load[1]:.1f} after",
    )
    return header + "\n" + render_table(head, rows)
