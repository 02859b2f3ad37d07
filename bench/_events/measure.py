"""What an append pays to publish its event: the two publishers as conversations.events._send would run them,
a group member that counts deliveries, and one row of appends per layer and publisher.

Imported once django_setup() has run: it imports the apps at module level.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from typing import Any

import redis
from asgiref.sync import async_to_sync
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers, get_channel_layer
from django.conf import settings

from bench._common import log
from bench._events.report import WARMUP
from conversations import events
from conversations.events import conversation_group
from conversations.services import conversation_create, message_append_batch
from tenants.services import tenant_create

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
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def send_plain(group: str, message: dict[str, Any]) -> None:
    async_to_sync(get_channel_layer().group_send)(group, message)


def send_private(group: str, message: dict[str, Any]) -> None:
    loop, layer = events._publisher()
    loop.call_soon_threadsafe(events._enqueue, layer, group, message)


def private_idle() -> None:
    """Waits until the private loop has sent everything handed to it."""

    async def idle() -> None:
        while events._outbox or (events._drainer is not None and not events._drainer.done()):
            await asyncio.sleep(0)

    if events._publisher_loop is not None:
        asyncio.run_coroutine_threadsafe(idle(), events._publisher_loop).result(60)


def private_stop() -> None:
    """Stops the private loop, so the next row starts one with its own layer."""
    loop = events._publisher_loop
    if loop is not None and loop.is_running():
        loop.call_soon_threadsafe(loop.stop)
    events._publisher_loop = None
    events._publisher_layer = None


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


def row(
    tenant: Any, layer_name: str, layer: dict[str, Any] | None, publisher: str, appends: int
) -> dict[str, Any]:
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


def run(appends: int, redis_url: str) -> tuple[dict[str, Any], dict[tuple[str, str], dict[str, Any]]]:
    """The row without a layer, then a row per layer (in memory; Redis when it answers) and publisher."""
    tenant, _ = tenant_create(slug="bench-events", name="Bench events")
    layers: list[tuple[str, dict[str, Any]]] = [("in-memory", IN_MEMORY)]
    if redis_answers(redis_url):
        layers.append(("redis", redis_layer(redis_url)))
    else:
        log(f"{redis_url} does not answer: in-memory layer only")
    real_send = events._send
    try:
        log("appends without a channel layer ...")
        bare = row(tenant, "none", None, "none", appends)
        results = {}
        for name, layer in layers:
            for publisher in ("plain", "private loop"):
                log(f"{name}: {publisher} ...")
                results[name, publisher] = row(tenant, name, layer, publisher, appends)
    finally:
        events._send = real_send
    return bare, results
