"""What an append pays to publish its event to the conversation's sockets: the private publisher loop of
conversations/events.py (one event loop on a thread of its own; the append's on-commit hook hands it the
event with call_soon_threadsafe and returns) against the plain version (async_to_sync(group_send) per event
in the on-commit hook, the appending thread waits for the send). Baseline in the same run: the plain version.

Each row appends --appends single user messages through conversations.services.message_append_batch (on
SQLite in a temp dir; the vectors-on-append work is off, so the publisher is all that differs) on the
in-memory channel layer and, when it answers, channels_redis at --redis-url. Columns:
- publish µs: the time the appending thread spends in one event's on-commit publish (p50, p95);
- append ms: the whole append, publish included (p50), and without any publish (no channel layer);
- all sent ms: from the first append until the publisher has sent the last event (the private loop sends
  after the append returned; the plain version before);
- delivered: events a member of the conversation's group received, of those published.

Run from the repository root: .venv/bin/python bench/events.py [--appends 300] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import log, machine_header, percentile, render_table  # noqa: E402
from bench._django import django_setup  # noqa: E402

WARMUP = 20
IN_MEMORY = {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 100_000}}


def redis_layer(url: str) -> dict[str, Any]:
    # As config/django/base.py configures it, with a prefix of its own and room for every event of a row.
    return {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [{"address": url, "socket_timeout": None}],
            "prefix": f"mnemo-bench-events-{secrets.token_hex(4)}",
            "capacity": 100_000,
        },
    }


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


# --- the two publishers, as conversations.events._send would run them -------------------------------------


def send_plain(group: str, message: dict[str, Any]) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    async_to_sync(get_channel_layer().group_send)(group, message)


def send_private(group: str, message: dict[str, Any]) -> None:
    from conversations import events

    loop, layer = events._publisher()
    loop.call_soon_threadsafe(events._enqueue, layer, group, message)


def private_idle() -> None:
    """Waits until the private loop has sent everything handed to it."""
    from conversations import events

    async def idle() -> None:
        while events._outbox or (events._drainer is not None and not events._drainer.done()):
            await asyncio.sleep(0)

    if events._publisher_loop is not None:
        asyncio.run_coroutine_threadsafe(idle(), events._publisher_loop).result(60)


def private_stop() -> None:
    """Stops the private loop, so the next row starts one with its own layer."""
    from conversations import events

    loop = events._publisher_loop
    if loop is not None and loop.is_running():
        loop.call_soon_threadsafe(loop.stop)
    events._publisher_loop = None
    events._publisher_layer = None


# --- a member of the group --------------------------------------------------------------------------------


class Member:
    """A channel in the conversation's group, read after the row. On the in-memory layer it must live on the
    publisher's layer instance and loop (each instance holds its own queues); on Redis it has its own."""

    def __init__(self, layer: Any, group: str, run: Callable[[Any], Any]) -> None:
        self.layer, self.group, self.run = layer, group, run
        self.channel = run(layer.new_channel())
        run(layer.group_add(group, self.channel))

    def received(self) -> int:
        async def drain() -> int:
            count = 0
            while True:
                try:
                    await asyncio.wait_for(self.layer.receive(self.channel), timeout=0.5)
                except TimeoutError:
                    return count
                count += 1

        count = self.run(drain())
        self.run(self.layer.group_discard(self.group, self.channel))
        return count


def member_for(publisher: str, redis: bool, group: str) -> Member:
    from asgiref.sync import async_to_sync
    from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers, get_channel_layer

    from conversations import events

    if redis:
        return Member(
            channel_layers.make_backend(DEFAULT_CHANNEL_LAYER), group, lambda c: async_to_sync(_await)(c)
        )
    if publisher == "private loop":
        loop, layer = events._publisher()
        return Member(layer, group, lambda c: asyncio.run_coroutine_threadsafe(c, loop).result(60))
    return Member(get_channel_layer(), group, lambda c: async_to_sync(_await)(c))


async def _await(coroutine: Any) -> Any:
    return await coroutine


# --- one row ----------------------------------------------------------------------------------------------


def row(
    tenant: Any, layer_name: str, layer: dict[str, Any] | None, publisher: str, appends: int
) -> dict[str, Any]:
    from channels.layers import channel_layers
    from django.conf import settings

    from conversations import events
    from conversations.events import conversation_group
    from conversations.services import conversation_create, message_append_batch

    settings.CHANNEL_LAYERS = {"default": layer} if layer else {}
    channel_layers.backends.clear()
    private_stop()
    conversation = conversation_create(tenant=tenant, title=f"{layer_name} {publisher}")
    group = conversation_group(tenant_id=tenant.pk, conversation_id=conversation.pk)
    send = {"plain": send_plain, "private loop": send_private}.get(publisher)
    publish: list[float] = []

    def timed(group: str, message: dict[str, Any]) -> None:
        if send is None:
            return
        started = time.perf_counter()
        send(group, message)
        publish.append(time.perf_counter() - started)

    events._send = timed
    for i in range(WARMUP):
        message_append_batch(conversation=conversation, items=[{"role": "user", "content": f"warm-up {i}"}])
    if publisher == "private loop":
        private_idle()  # the warm-up's events are out before the member joins
    member = member_for(publisher, layer_name == "redis", group) if send is not None else None
    publish.clear()
    append, all_sent = timed_appends(conversation, appends, private=publisher == "private loop")
    delivered = member.received() if member is not None else 0
    private_stop()
    return {"publish": publish, "append": append, "all_sent": all_sent, "delivered": delivered}


def timed_appends(conversation: Any, appends: int, *, private: bool) -> tuple[list[float], float]:
    """(seconds of each append, seconds from the first append until the publisher has sent the last event)."""
    from conversations.services import message_append_batch

    append: list[float] = []
    first = time.perf_counter()
    for i in range(appends):
        started = time.perf_counter()
        message_append_batch(
            conversation=conversation,
            items=[{"role": "user", "content": f"Message {i}: the deploy of build {i}."}],
        )
        append.append(time.perf_counter() - started)
    if private:
        private_idle()
    return append, time.perf_counter() - first


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--appends", type=int, default=300, help="measured appends per row")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    # An append's vectors are computed on commit when there is an embedder: off, only the publisher differs.
    os.environ["MNEMO_EMBEDDINGS"] = "none"
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-events-") as scratch:
        django_setup(var_dir=Path(scratch))
        from conversations import events
        from tenants.services import tenant_create

        tenant, _ = tenant_create(slug="bench-events", name="Bench events")
        layers: list[tuple[str, dict[str, Any]]] = [("in-memory", IN_MEMORY)]
        if redis_answers(args.redis_url):
            layers.append(("redis", redis_layer(args.redis_url)))
        else:
            log(f"{args.redis_url} does not answer: in-memory layer only")
        real_send = events._send
        try:
            log("appends without a channel layer ...")
            bare = row(tenant, "none", None, "none", args.appends)
            results = {}
            for name, layer in layers:
                for publisher in ("plain", "private loop"):
                    log(f"{name}: {publisher} ...")
                    results[name, publisher] = row(tenant, name, layer, publisher, args.appends)
        finally:
            events._send = real_send
    print(report(args, bare, results, load=(load_before, os.getloadavg()[0])))
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
