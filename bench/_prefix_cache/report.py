"""The prefix-cache table: each figure of Mnemo against the naive baseline, per budget, and per turn."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import replace

from bench._common import (
    render_table,
)
from bench._prefix_cache.turns import FIRST_STEADY_TURN, TurnStat


def pct(value: float) -> str:
    return f"{value:.1%}"


def ratio(ours: float, theirs: float) -> str:
    if theirs == 0:
        return "∞" if ours > 0 else "-"
    return f"{ours / theirs:.2f}"


Measure = Callable[[list[TurnStat]], float]


def _mean_share(which: list[int]) -> Measure:
    return lambda stats: statistics.fmean(stats[t].share for t in which) if which else math.nan


def _min_share(which: list[int]) -> Measure:
    return lambda stats: min(stats[t].share for t in which) if which else math.nan


def _summed(every: list[int]) -> Measure:
    # What the bill sees: cached tokens over prompt tokens of the whole conversation.
    return lambda stats: sum(stats[t].cached for t in every) / sum(stats[t].prompt_tokens for t in every)


def _reused(steady: list[int]) -> Measure:
    return lambda stats: statistics.fmean(stats[t].reused for t in steady) if steady else math.nan


def _ceiling(steady: list[int], cacheable: Callable[[int], int]) -> Measure:
    # The whole previous prompt as the cached prefix: only this turn's new messages are new.
    def measure(stats: list[TurnStat]) -> float:
        def best(t: int) -> float:
            return min(1.0, cacheable(stats[t - 1].prompt_tokens) / stats[t].prompt_tokens)

        return statistics.fmean(best(t) for t in steady) if steady else math.nan

    return measure


def _tokens(reduce: Callable[..., float]) -> Measure:
    return lambda stats: reduce(s.prompt_tokens for s in stats)


def section_rows(
    label: str,
    mnemo: list[TurnStat],
    naive: list[TurnStat],
    window: int,
    cacheable: Callable[[int], int],
) -> list[tuple[str, str, str, str]]:
    turns = len(mnemo)
    steady = [t for t in range(FIRST_STEADY_TURN, turns) if not mnemo[t].moved]
    every = list(range(1, turns))
    figures: list[tuple[str, Measure, Callable[[float], str]]] = [
        (f"mean cached share, steady turns (n={len(steady)})", _mean_share(steady), pct),
        (f"mean cached share, all turns 2..{turns} (n={len(every)})", _mean_share(every), pct),
        ("cached / prompt tokens summed over all turns", _summed(every), pct),
        ("min cached share, steady turns", _min_share(steady), pct),
        (f"min cached share, all turns 2..{turns}", _min_share(every), pct),
        ("previous prompt reused as prefix, steady", _reused(steady), pct),
        ("ceiling: whole previous prompt cached, steady", _ceiling(steady, cacheable), pct),
        ("mean prompt tokens", _tokens(statistics.fmean), lambda v: f"{v:,.0f}"),
        ("max prompt tokens", _tokens(max), lambda v: f"{v:,.0f}"),
    ]
    rows = [
        (f"{label}: {name}", fmt(measure(mnemo)), fmt(measure(naive)), ratio(measure(mnemo), measure(naive)))
        for name, measure, fmt in figures
    ]
    cuts = sum("cut" in s.event for s in mnemo)
    compactions = sum("compacted" in s.event for s in mnemo)
    rows.insert(
        7,
        (
            f"{label}: turns where the prefix was reset",
            f"{sum(s.moved for s in mnemo)} ({cuts} window cuts, {compactions} compactions)",
            f"{sum(s.moved for s in naive)} window slides (last {window} msgs)",
            "-",
        ),
    )
    # Mnemo's prediction for each call, scored like the measurement.
    predicted = [replace(s, cached=s.predicted or 0) for s in mnemo]
    rows.append(
        (
            f"{label}: Mnemo's own predicted_cached_tokens share, steady",
            pct(_mean_share(steady)(predicted)),
            "-",
            "-",
        )
    )
    return rows


def per_turn_table(label: str, mnemo: list[TurnStat], naive: list[TurnStat]) -> str:
    rows = []
    for t, (m, n) in enumerate(zip(mnemo, naive, strict=True)):
        rows.append(
            (
                str(t + 1),
                f"{m.prompt_tokens:,}",
                f"{m.prefix_tokens:,}",
                pct(m.share),
                m.event,
                f"{m.predicted:,}" if m.predicted is not None else "-",
                f"{n.prompt_tokens:,}",
                f"{n.prefix_tokens:,}",
                pct(n.share),
                n.event,
            )
        )
    head = ("turn", "Mnemo tokens", "common prefix", "cached", "reset", "predicted", "naive tokens",
            "common prefix", "cached", "reset")  # fmt: skip
    return f"\n{label}, per turn\n" + render_table(head, rows)
