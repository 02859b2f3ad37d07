"""What a soak run reports: statuses, latencies, lost messages, seq gaps, embedding lag and backlog,
memory."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from bench._common import percentile, render_table
from bench._soak.clients import Record
from bench._soak.run import Samples


def seq_gaps(stored: dict[str, tuple[str, int]]) -> int:
    by_conversation: dict[str, list[int]] = defaultdict(list)
    for conversation, seq in stored.values():
        by_conversation[conversation].append(seq)
    return sum(max(seqs) - len(seqs) for seqs in by_conversation.values())


def rss_growth(samples: Samples, seconds: float) -> tuple[float, float, float, float]:
    """Server MB (with its embedded worker) at start, after the warm-up of the load (minute 2; a quarter of
    a shorter run), at the end of the load, and the growth from the warm-up to the end in percent."""
    start = samples.rss[0][1]
    warm = min(120.0, seconds / 4)
    at_warm = next((mb for t, mb, _w in samples.rss if t >= warm), start)
    end = samples.rss[-1][1]
    return start, at_warm, end, (end - at_warm) / at_warm * 100 if at_warm else 0.0


def latency_table(records: list[Record]) -> str:
    """p50 / p99 per endpoint, with the CPU each request's thread ran in the server (Server-Timing's `cpu`)
    and that endpoint's share of all of it: which calls the server spends its cores on. A streamed proxy reply
    carries no Server-Timing (n/a)."""
    by_endpoint: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_endpoint[record.endpoint].append(record)
    total_cpu = sum(r.cpu_ms or 0.0 for r in records) or 1.0
    rows = []
    for name, group in sorted(by_endpoint.items()):
        ms = [r.ms for r in group]
        cpus = [r.cpu_ms for r in group if r.cpu_ms is not None]
        cpu = f"{sum(cpus) / len(cpus):.1f} / {sum(cpus) / total_cpu:.0%}" if cpus else "n/a"
        rows.append([name, str(len(ms)), f"{percentile(ms, 50):.1f}", f"{percentile(ms, 99):.1f}", cpu])
    return render_table(
        ["endpoint", "requests", "p50 ms", "p99 ms", "server CPU ms per request / share"], rows
    )


def slowest_context(records: list[Record], share: float = 0.02) -> str:
    """Where the slowest `share` of the context calls spent their time, by the server's Server-Timing: waiting
    for a thread after the server received them, in the server (middleware and view; how much of it the
    request's thread ran), and the rest (the event loop, the network, the client); means in ms."""
    timed = [r for r in records if r.endpoint.startswith("context") and r.app_ms is not None]
    if not timed:
        return "n/a (no Server-Timing)"
    slowest = sorted(timed, key=lambda r: r.ms)[-max(1, round(len(timed) * share)) :]
    queue = sum(r.queue_ms or 0.0 for r in slowest) / len(slowest)
    app = sum(r.app_ms or 0.0 for r in slowest) / len(slowest)
    cpu = sum(r.cpu_ms or 0.0 for r in slowest) / len(slowest)
    total = sum(r.ms for r in slowest) / len(slowest)
    rest = total - queue - app
    in_server = f"{app:.1f} in the server ({cpu:.1f} running)"
    if all(r.queue_ms is None for r in slowest):  # a WSGI server does not say when it received a request
        return f"{total:.1f} = {in_server} + {rest:.1f} rest (the wait for a thread among it)"
    return f"{total:.1f} = {queue:.1f} waiting for a thread + {in_server} + {rest:.1f} rest"


def context_by_minute(records: list[Record], started: float, seconds: float) -> str:
    """Context p50 / p99 in each minute of the load: the tail grows as the conversations do, which one
    figure for the whole run hides. The last requests, answered after the deadline, count in the last
    minute."""
    last = max(0, int(seconds // 60) - 1)
    by_minute: dict[int, list[float]] = defaultdict(list)
    for record in records:
        if record.endpoint.startswith("context"):
            by_minute[min(last, int((record.at - started) // 60))].append(record.ms)
    return ", ".join(
        f"{minute + 1}: {percentile(ms, 50):.0f} / {percentile(ms, 99):.0f}"
        for minute, ms in sorted(by_minute.items())
    )


def backlog_line(samples: Samples) -> str:
    points = samples.backlog[:: max(1, len(samples.backlog) // 16)] + samples.backlog[-1:]
    return ", ".join(f"{t:.0f}s:{n}" for t, n in points)


def summary(result: dict[str, Any]) -> list[list[str]]:
    shared, samples, stored = result["shared"], result["samples"], result["stored"]
    statuses = Counter(r.status for r in shared.records)
    missing = [m for m in shared.acked if m not in stored]
    lags = [max(0.0, result["vectors"][m] - t) for m, t in shared.acked.items() if m in result["vectors"]]
    start, at_warm, end, growth = rss_growth(samples, result["seconds"])
    context = [r.ms for r in shared.records if r.endpoint.startswith("context")]
    drained = result["drained"]
    failed = sum(n for s, n in statuses.items() if s >= 500 or s == 0)
    html = sum(r.html and r.status >= 400 for r in shared.records)
    names = "yes" if shared.names else "no (the server refused `name`: unknown field)"
    lag = f"{percentile(lags, 50):.1f} s / {percentile(lags, 99):.1f} s"
    context_ms = f"{percentile(context, 50):.1f} ms / {percentile(context, 99):.1f} ms"
    quiet = result["quiet_context"]
    quiet_ms = f"{percentile(quiet, 50):.1f} ms / {percentile(quiet, 99):.1f} ms ({len(quiet)} calls)"
    return [
        ["requests by status", ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items()))],
        ["responses >= 500 (and failed connections)", str(failed)],
        ["HTML error bodies", str(html)],
        ["messages acknowledged / stored / missing", f"{len(shared.acked)} / {len(stored)} / {len(missing)}"],
        ["seq gaps", str(seq_gaps(stored))],
        ["speaker names sent", names],
        ["embedding lag p50 / p99 (append -> vector)", lag],
        ["backlog drained after the load", "not within 300 s" if drained is None else f"{drained:.1f} s"],
        ["tasks left queued", str(result["queued"])],
        ["memory agent caught up", result["agent"]],
        ["context p50 / p99 (all budgets)", context_ms],
        ["baseline: context p50 / p99 after the load, one client", quiet_ms],
        ["slowest 2 % of context calls under the load, mean ms", slowest_context(shared.records)],
        [
            "context p50 / p99 by minute of the load, ms",
            context_by_minute(shared.records, samples.started, result["seconds"]),
        ],
        ["server RSS start / warm / end", f"{start:.0f} / {at_warm:.0f} / {end:.0f} MB ({growth:+.1f} %)"],
        ["PostgreSQL autovacuum", result["stack"].autovacuum],
        ["machine load average (5 min) at the end of the load", f"{result['load_average']:.1f}"],
        *result["machine"].lines(),
        [
            "worker RSS start / end (embedded: the server's worker process, counted above too)",
            f"{samples.rss[0][2]:.0f} / {samples.rss[-1][2]:.0f} MB",
        ],
    ]


def report(result: dict[str, Any]) -> str:
    shared, samples = result["shared"], result["samples"]
    parts = [
        f"## {result['stack'].name}",
        render_table(["figure", "value"], summary(result)),
        latency_table(shared.records),
        f"backlog over time (s:messages without vectors): {backlog_line(samples)}",
    ]
    if shared.errors:
        parts.append("first errors:\n" + "\n".join(f"  {e}" for e in shared.errors[:10]))
    return "\n\n".join(parts)
