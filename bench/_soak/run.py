"""One soak run: the load, the samples taken meanwhile, and the drain once the load stops."""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis

from bench._common import log
from bench._soak.clients import Client, Shared, names_accepted, quiet_context_ms, warm_up
from bench._soak.machine import MachineLoad, cpu_clock, server_pids, server_wait, steal_share, thread_times
from bench._soak.stack import Stack
from bench._soak.store import Store


@dataclass
class Samples:
    started: float
    backlog: list[tuple[float, int]] = field(default_factory=list)
    rss: list[tuple[float, float, float]] = field(default_factory=list)  # (t, server MB, workers MB)


def sample(stack: Stack, store: Store, samples: Samples, stop: threading.Event, every: float = 5.0) -> None:
    while not stop.wait(every):
        t = time.monotonic() - samples.started
        with contextlib.suppress(Exception):  # a busy SQLite file: the next sample
            samples.backlog.append((t, store.backlog()))
        samples.rss.append((t, stack.server_rss(), stack.workers_rss()))


def drain(stack: Stack, store: Store, samples: Samples, limit: float = 300.0) -> float | None:
    """Seconds from the end of the load until every stored message has its vectors (None: not within
    `limit`)."""
    ended = time.monotonic()
    while time.monotonic() - ended < limit:
        backlog = store.backlog()
        samples.backlog.append((time.monotonic() - samples.started, backlog))
        if backlog == 0:
            return time.monotonic() - ended
        if len(samples.backlog) % 20 == 0:
            log(f"  {backlog} messages without vectors")
        time.sleep(0.5)
    return None


def _quiet(stack: Stack, shared: Shared, machine: MachineLoad) -> list[float]:
    """The context baseline (quiet_context_ms), how long the server's threads waited for a core then, and
    how much of the cores the hypervisor took meanwhile."""
    before, clock = thread_times(server_pids(stack)), cpu_clock()
    ms = quiet_context_ms(shared)
    machine.quiet_waited = server_wait(stack, before)
    machine.quiet_stolen = steal_share(clock)
    return ms


def queued_tasks(stack: Stack) -> int | str:
    """Task messages still waiting on the broker (Celery's default queue), after the drain."""
    redis_url = stack.env.get("REDIS_URL")
    if not redis_url:
        return "n/a (embedded)"

    return int(redis.Redis.from_url(redis_url).llen("celery"))


def agent_caught_up(shared: Shared) -> str:
    """Conversations whose memory agent has read every completed exchange (a short wait for the last run)."""
    headers = {"Authorization": f"Bearer {shared.key}"}
    deadline = time.monotonic() + 60
    while True:
        pending = [
            c
            for c in shared.conversations
            if httpx.get(f"{shared.url}/api/v1/conversations/{c}/memory-agent", headers=headers, timeout=30)
            .json()
            .get("pending")
        ]
        if not pending or time.monotonic() > deadline:
            return f"{len(shared.conversations) - len(pending)} of {len(shared.conversations)}"
        time.sleep(2)


def run(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    log(f"{stack.name}: starting on port {stack.port}")
    try:
        stack.start()  # a server that never became ready is stopped too (finally)
        store = Store(stack)
        warm_up(stack.url, stack.key)
        names = names_accepted(stack.url, stack.key)
        seconds = args.minutes * 60
        shared = Shared(stack.url, stack.key, time.monotonic() + seconds, args.clients / args.rate, names)
        if args.appends_only:
            shared.actions = {"append": 1}
        samples = Samples(started=time.monotonic())
        samples.rss.append((0.0, stack.server_rss(), stack.workers_rss()))
        stop = threading.Event()
        sampler = threading.Thread(target=sample, args=(stack, store, samples, stop), daemon=True)
        sampler.start()
        clients = [threading.Thread(target=Client(shared, n).run) for n in range(args.clients)]
        machine = MachineLoad(stack)
        machine.start()
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        machine.stop()
        log(f"{stack.name}: load stopped after {time.monotonic() - samples.started:.0f} s; draining")
        load_average = os.getloadavg()[1]  # the machine's, other users' work included
        samples.rss.append((time.monotonic() - samples.started, stack.server_rss(), stack.workers_rss()))
        stop.set()
        drained = drain(stack, store, samples)
        # The memory agent's runs are queued after the vectors they follow: the queue is read once they have
        # caught up too, so that a task counted as left is one that nothing would run.
        agent = agent_caught_up(shared)
        return {
            "stack": stack,
            "seconds": seconds,
            "load_average": load_average,
            "machine": machine,
            "shared": shared,
            "samples": samples,
            "drained": drained,
            "queued": queued_tasks(stack),
            "agent": agent,
            "quiet_context": _quiet(stack, shared, machine),
            "stored": store.messages(),
            "vectors": store.vector_times(),
        }
    finally:
        stack.stop()
