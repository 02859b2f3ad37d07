"""The proxy table: the proxy's overhead over calling the upstream directly."""

from __future__ import annotations

from bench._common import machine_header, percentile, render_table


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def report(
    series: dict[str, list[float]], errors: int, streams: int, elapsed: float, args, database: str
) -> str:
    rows = []
    for label, proxy, direct in (
        ("total", "proxy_total", "direct_total"),
        ("first byte", "proxy_first", "direct_first"),
    ):
        for p in (50, 95):
            a, b = percentile(series[proxy], p), percentile(series[direct], p)
            rows.append([f"{label} p{p}", ms(a), ms(b), ms(a - b), f"{a / b:.1f}x" if b else "-"])
    for name in ("append", "context", "upstream"):
        rows.append([f"proxy {name} (Server-Timing) p50", ms(percentile(series[name], 50)), "-", "-", "-"])
    rows.append(
        ["context pipeline in-process, no HTTP p50", ms(percentile(series["pipeline"], 50)), "-", "-", "-"]
    )
    first_added = percentile(series["proxy_first"], 50) - percentile(series["direct_first"], 50)
    beyond = first_added - percentile(series["append"], 50) - percentile(series["context"], 50)
    rows.append(["first byte added beyond append+context p50", ms(beyond), "-", "-", "-"])
    rows.append([f"{streams} concurrent streams: errors", str(errors), "-", "-", f"{elapsed:.1f} s in all"])
    header = machine_header(
        "bench/proxy.py",
        f"granian ASGI, 2 workers; {database}; {args.messages}-message conversation; {args.rounds} rounds",
    )
    table = render_table(["figure", "through Mnemo", "upstream direct", "added", "ratio"], rows)
    return f"{header}\n\n{table}"
