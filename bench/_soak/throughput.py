"""Embedding throughput: a backlog appended while no worker runs, drained by one and then two Celery
workers."""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

import httpx

from bench._common import log, render_table
from bench._soak.clients import sentence
from bench._soak.stack import Stack, distributed_stack, port_from
from bench._soak.store import Store


def ingest(stack: Stack, conversations: int, per_conversation: int) -> int:
    """Messages appended in batches while no worker runs: their vector tasks wait on the broker."""
    rng = random.Random(7)
    headers = {"Authorization": f"Bearer {stack.key}"}
    base = f"{stack.url}/api/v1/conversations"
    with httpx.Client(headers=headers, timeout=120) as http:
        for _ in range(conversations):
            conversation = http.post(base, json={}).json()["id"]
            for start in range(0, per_conversation, 50):
                items = [
                    {"role": "user", "content": sentence(rng)}
                    for _ in range(min(50, per_conversation - start))
                ]
                http.post(f"{base}/{conversation}/messages", json={"messages": items}).raise_for_status()
    return conversations * per_conversation


def drain_rate(args: argparse.Namespace, upstream: str, port: int, workers: int) -> tuple[int, float]:
    """Vectors per second once `workers` workers start on a backlog, counted from the tenth percentile of the
    vectors' write times to the last: the workers start one after another (each loads the model on its first
    task), and the first tenth is written before the last of them has begun."""
    with tempfile.TemporaryDirectory(prefix="mnemo-soak-throughput-") as scratch:
        stack = distributed_stack(Path(scratch), upstream, port, args.database_url, args.redis_url, 0)
        stack.start()
        try:
            count = ingest(stack, args.clients, 300)
            store = Store(stack)
            stack.workers_start(workers)
            deadline = time.monotonic() + 900
            while store.backlog() and time.monotonic() < deadline:
                time.sleep(1)
            times = sorted(store.vector_times().values())
        finally:
            stack.stop()
    first = len(times) // 10
    return count, (len(times) - first) / (times[-1] - times[first]) if len(times) > first + 1 else 0.0


def throughput_report(args: argparse.Namespace, upstream: str, port: int) -> str:
    rows, rates = [], []
    for workers in (1, 2):
        log(f"throughput: {workers} worker(s)")
        count, rate = drain_rate(args, upstream, port_from(port), workers)
        rates.append(rate)
        ratio = f"{rate / rates[0]:.2f}x" if rates[0] else "n/a"
        rows.append([str(workers), str(count), f"{rate:.1f}", ratio, f"{os.getloadavg()[0]:.1f}"])
    return "## Embedding throughput, Celery workers\n\n" + render_table(
        ["workers", "messages", "vectors/s", "vs 1 worker", "load average after"], rows
    )
