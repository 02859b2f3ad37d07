"""The visual benchmark's header and table: each figure against its baseline from the same run."""

from __future__ import annotations

import argparse
import statistics

from bench._common import MODEL, machine_header, render_table
from bench._visual.screens import H, W


def header(args: argparse.Namespace) -> str:
    return machine_header(
        "bench/visual.py",
        f"session: {args.turns} turns, 3–8 steps each, {W}×{H} PNG frames, seed {args.seed}; "
        f"model {MODEL}; embedded SQLite, file tiers, eager Celery",
    )


def ms(values: list[float]) -> str:
    return f"{statistics.mean(values) * 1e3:.2f} ms"


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


def _ratio(ours: float, base: float, *, pct: bool = False) -> str:
    if not base:
        return "—"
    # Two decimals: the target sits close to what one decimal would round onto.
    return f"{(ours / base - 1) * 100:+.2f} %" if pct else f"{ours / base:.2f}×"


TableRow = tuple[str, str, str, str]  # figure, Mnemo, baseline, ratio


def table(r: dict) -> str:
    rows = [*_token_rows(r), *_dedup_rows(r), *_time_rows(r)]
    return render_table(("figure", "Mnemo", "baseline", "ratio"), rows)


def _token_rows(r: dict) -> list[TableRow]:
    """Image tokens in the history, what the model sees as pixels, bytes stored."""
    full = 1105
    return [
        (
            f"image tokens in the history after {r['turns']} turns",
            f"{r['mnemo_tokens']:,}",
            f"{r['baseline_tokens']:,} (every frame, full price)",
            _ratio(r["mnemo_tokens"], r["baseline_tokens"], pct=True),
        ),
        (
            "image tokens per compacted frame (placeholder)",
            f"{r['placeholder_tokens']:.1f} ({r['compacted']} frames)",
            f"{full} (1920×1080, high detail)",
            _ratio(r["placeholder_tokens"], full, pct=True),
        ),
        (
            "frames the model sees as pixels",
            f"{r['kept']} of {r['frames']}",
            f"{r['frames']}",
            _ratio(r["kept"], r["frames"], pct=True),
        ),
        (
            "bytes stored (both tiers)",
            f"{r['stored_bytes'] / 1e6:.1f} MB",
            f"{r['received_bytes'] / 1e6:.1f} MB received",
            _ratio(r["stored_bytes"], r["received_bytes"], pct=True),
        ),
    ]


def _dedup_rows(r: dict) -> list[TableRow]:
    """How many frames were deduplicated, and how many wrongly."""
    kinds = ", ".join(f"{k} {d}/{n}" for k, (d, n) in r["by_kind"].items())
    return [
        (
            "dedup rate (frames stored as 'screen unchanged')",
            f"{r['dups'] / r['frames']:.1%} (pHash ≤ 10 + grid ≤ 2)",
            f"{r['sha_dups'] / r['frames']:.1%} (identical bytes)",
            _ratio(r["dups"], r["sha_dups"]),
        ),
        ("unchanged screens deduplicated", f"{r['unchanged_dedup']} of {r['unchanged']}", "—", "—"),
        (
            "false duplicates among frames that truly changed",
            f"{r['false_dups'] / max(1, r['changed']):.1%} ({r['false_dups']} of {r['changed']}: {kinds})",
            f"{r['phash_only_false'] / max(1, r['changed']):.1%} (pHash ≤ 10 alone)",
            "—",
        ),
    ]


def _time_rows(r: dict) -> list[TableRow]:
    """What compaction, hashing, decoding, reading and appending cost."""
    drift = ", ".join(f"{k} {max(v)}" for k, v in r["drift"].items())
    return [
        (
            "compaction ms per turn (mean / p95)",
            f"{ms(r['compact'])} / {p95(r['compact']) * 1e3:.2f} ms",
            "—",
            "—",
        ),
        (
            "turn end ms incl. compaction + cold move (mean)",
            ms(r["end"]),
            f"{ms(r['plain_end'])} (turn without images)",
            _ratio(statistics.mean(r["end"]), statistics.mean(r["plain_end"])),
        ),
        (
            "hash ms per frame (pHash+dHash+aHash)",
            f"{ms(r['hash_reduced'])} (frame ÷8)",
            f"{ms(r['hash_full'])} (full frame)",
            _ratio(statistics.mean(r["hash_reduced"]), statistics.mean(r["hash_full"])),
        ),
        ("hash drift reduced vs full (max Hamming)", drift, "0", "—"),
        ("decode + validate ms per frame (Pillow)", ms(r["decode"]), "—", "—"),
        (
            "read ms per image incl. sha256 check",
            f"{ms(r['cold'])} (cold tier)",
            f"{ms(r['hot'])} (hot tier)",
            _ratio(statistics.mean(r["cold"]), statistics.mean(r["hot"])),
        ),
        ("append ms per step (call + screenshot)", ms(r["append"]), "—", "—"),
    ]
