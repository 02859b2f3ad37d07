"""The context-latency tables: latency per size against the baseline size and the floor, stages, targets."""

from __future__ import annotations

import argparse
import statistics

from bench._common import (
    MODEL,
    machine_header,
    percentile,
    render_table,
)
from bench._context_latency.measure import Series
from providers.embeddings import embedder_status

BASELINE_SIZE = 1_000


TARGET_SIZE = 10_000


TARGET_P50_MS = 20.0


TARGET_P99_MS = 60.0


TARGET_LARGEST_RATIO = 1.3


def report(
    series: list[Series], floor: Series, args: argparse.Namespace, context: list[str]
) -> tuple[str, bool]:
    baseline = next((s for s in series if s.size == BASELINE_SIZE), None)
    table = _latency_table(series, floor, baseline)
    stages = _stage_table(series)
    checks = _target_checks(series, baseline)
    ok = all(verdict == "met" for _, _, verdict in checks)
    verdicts = render_table(("target", "measured", "verdict"), checks) if checks else ""
    header = machine_header("bench/context_latency.py", *context)
    return f"{header}\n{table}\n\n{stages}\n\n{verdicts}", ok


def _latency_table(series: list[Series], floor: Series, baseline: Series | None) -> str:
    def vs_baseline(value: float) -> str:
        return f"{value / baseline.ms(50):.2f}" if baseline else "-"

    rows = [
        (
            f"{s.size:,} messages",
            f"{s.prompt_segments} + {s.prompt_messages} / {s.prompt_tokens:,}",
            f"{s.ms(50):.2f}",
            f"{s.ms(99):.2f}",
            f"{s.mean_ms:.2f}",
            f"{statistics.fmean(s.cpu_seconds) * 1e3:.2f}",
            f"{s.first_call * 1e3:.1f}",
            f"{s.first_call_mb:.1f}",
            str(s.queries),
            vs_baseline(s.ms(50)),
        )
        for s in series
    ]
    floor_ms = (f"{floor.ms(50):.2f}", f"{floor.ms(99):.2f}", f"{floor.mean_ms:.2f}")
    rows.append((floor.label, "-", *floor_ms, "-", "-", "-", "1", vs_baseline(floor.ms(50))))
    head = ("conversation", "B4 segs + B6 msgs / tokens", "p50 ms", "p99 ms", "mean ms", "CPU ms (mean)",
            "first call ms", "first call +MB", "queries", "p50 ratio vs 1k")  # fmt: skip
    return render_table(head, rows)


def _stage_table(series: list[Series]) -> str:
    # p99 next to p50: a tail that sits in one stage (a plan, a commit) shows where to look.
    stage_names = [name for name in series[0].stages if max(max(s.stages[name]) for s in series) >= 0.05]
    stage_rows = [
        (
            f"{s.size:,} messages",
            *[
                f"{percentile(s.stages[name], 50):.2f} / {percentile(s.stages[name], 99):.1f}"
                for name in stage_names
            ],
        )
        for s in series
    ]
    return render_table(("stage ms, p50 / p99", *stage_names), stage_rows)


def _target_checks(series: list[Series], baseline: Series | None) -> list[tuple[str, str, str]]:
    """(target, measured, met or MISSED) for the latency at TARGET_SIZE and the largest size's growth."""
    checks = []
    target = next((s for s in series if s.size == TARGET_SIZE), None)
    if target:
        met = target.ms(50) <= TARGET_P50_MS and target.ms(99) <= TARGET_P99_MS
        checks.append(
            (
                f"{TARGET_SIZE:,} messages: p50 ≤ {TARGET_P50_MS:.0f} ms, p99 ≤ {TARGET_P99_MS:.0f} ms",
                f"{target.ms(50):.2f} / {target.ms(99):.2f} ms",
                "met" if met else "MISSED",
            )
        )
    largest = max(series, key=lambda s: s.size)
    if baseline and largest.size > BASELINE_SIZE:
        ratio = largest.ms(50) / baseline.ms(50)
        checks.append(
            (
                f"{largest.size:,} p50 within {TARGET_LARGEST_RATIO}x of {BASELINE_SIZE:,} p50",
                f"{ratio:.2f}x ({largest.ms(50):.2f} vs {baseline.ms(50):.2f} ms)",
                "met" if ratio <= TARGET_LARGEST_RATIO else "MISSED",
            )
        )
    return checks


def context_lines(
    args: argparse.Namespace, series: list[Series], pg_version: str, *, load: tuple[float, float]
) -> list[str]:
    """The header's lines on what was measured and how busy the machine was."""
    loads = ", ".join(f"{s.size:,} in {s.load_seconds:.1f}s" for s in series)
    model = embedder_status().embedder
    vectors = f"retrieval vectors of every message ({model.name})" if model else "no embedding model"
    return [
        f"{pg_version} on this machine; in-process context call (assemble + payload + JSON), "
        f"model {MODEL}, default budget, openai format",
        f"{args.calls} timed calls per size after {args.warmup} warm-up calls, interleaved; "
        f"seed {args.seed!r}; loaded with bulk_create: {loads}; {vectors}",
        # The database and everything else on the machine share its cores: say how busy it was.
        f"1-minute load average {load[0]:.1f} before timing, {load[1]:.1f} after",
    ]
