"""Events to WebSocket clients of a conversation. They are sent after the transaction commits, never
before the data they describe is visible."""

import asyncio
import atexit
import collections
import contextlib
import logging
import threading
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import DEFAULT_CHANNEL_LAYER, InMemoryChannelLayer, channel_layers, get_channel_layer
from django.db import transaction

from providers.background import server_handler, server_notify

logger = logging.getLogger(__name__)

EVENT_TYPES = (
    "message.appended",
    "message.updated",
    "turn.started",
    "turn.ended",
    # visual compaction of an ended turn (conversations/visual.py)
    "turn.compacted",
    # compaction and its summary segments (the summaries app publishes these)
    "compaction.started",
    "compaction.completed",
    "compaction.failed",
    "summary.updated",
    # a document of the conversation changed status (the knowledge app publishes it)
    "document.updated",
)


def conversation_group(*, tenant_id: Any, conversation_id: Any) -> str:
    return f"t{_hex(tenant_id)}.c{_hex(conversation_id)}"


def _hex(value: Any) -> str:
    return getattr(value, "hex", None) or str(value).replace("-", "")


def event_publish(*, tenant_id: Any, conversation_id: Any, event: str, data: dict[str, Any]) -> None:
    """Queue an event for the conversation's sockets; it goes out when the current transaction commits."""
    if event not in EVENT_TYPES:
        raise ValueError(f"unknown event type {event!r}")
    group = conversation_group(tenant_id=tenant_id, conversation_id=conversation_id)
    message = {
        # Channels maps the type to the consumer handler name (dots become underscores).
        "type": "conversation.event",
        "event": event,
        "conversation_id": str(conversation_id),
        "tenant_id": str(tenant_id),
        "data": data,
    }
    transaction.on_commit(lambda: _send(group, message))


# The server's event loop, when this process serves sockets (config/asgi.py binds it). Events raised on the
# HTTP threads are handed to it instead of each starting an event loop of its own (a thread per event with
# async_to_sync), and they leave in the order they were raised. Touched only on that loop's thread.
_server_loop: asyncio.AbstractEventLoop | None = None
_outbox: collections.deque[tuple[Any, str, dict[str, Any]]] = collections.deque()
_drainer: asyncio.Task[None] | None = None


def events_bind_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _server_loop
    _server_loop = loop


# A process without a server loop (a WSGI server's workers, Celery workers) whose layer reaches other
# processes (channels_redis) hands its events to a loop on a thread of its own, started on first use: one
# loop for the process instead of a thread and a loop per event, and the events leave in order. The loop
# has a layer instance of its own: a layer's connections belong to the loop that opened them.
# It pays (bench/events.py; the figures are in docs/benchmarks.md): the plain async_to_sync(group_send) per
# event on commit starts an event loop, and channels_redis its connections for that loop, for every event,
# which costs the append's thread far more than handing the event over, and delays the events behind it.
# The in-memory layer keeps the plain call below: its queues live in one layer
# instance, which a loop of its own would not share.
_publisher_loop: asyncio.AbstractEventLoop | None = None
_publisher_layer: Any = None
_publisher_lock = threading.Lock()


def _publisher() -> tuple[asyncio.AbstractEventLoop, Any]:
    global _publisher_loop, _publisher_layer
    with _publisher_lock:
        if _publisher_loop is None or not _publisher_loop.is_running():
            loop = asyncio.new_event_loop()
            started = threading.Event()
            loop.call_soon(started.set)
            threading.Thread(target=loop.run_forever, name="mnemo-events", daemon=True).start()
            started.wait()
            _publisher_loop = loop
            _publisher_layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
        return _publisher_loop, _publisher_layer


@atexit.register
def events_flush(timeout: float = 2.0) -> None:
    """Wait until what this process handed to its publisher loop is sent: at exit (a short-lived process,
    such as a management command), and where a caller needs earlier events out before it goes on."""
    loop = _publisher_loop
    if loop is None or not loop.is_running():
        return

    async def drained() -> None:
        while _outbox or (_drainer is not None and not _drainer.done()):
            await asyncio.sleep(0.01)

    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(drained(), loop).result(timeout)


def _send(group: str, message: dict[str, Any]) -> None:
    if server_notify("event", [group, message]):
        return  # the embedded worker process: the server's sockets are the server's
    layer = get_channel_layer()
    if layer is None:
        return
    loop = _server_loop
    if loop is not None and loop.is_running():
        loop.call_soon_threadsafe(_enqueue, layer, group, message)
        return
    if not isinstance(layer, InMemoryChannelLayer):
        loop, own_layer = _publisher()
        loop.call_soon_threadsafe(_enqueue, own_layer, group, message)
        return
    # Tests and management commands on the in-memory layer: its queues belong to the caller's loop.
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:
        # The data is committed; a lost notification must not turn a stored write into a 500.
        logger.exception("could not publish %s to %s", message["event"], group)


def _event_from_worker(payload: list[Any]) -> None:
    group, message = payload
    _send(group, message)


server_handler("event", _event_from_worker)


def _enqueue(layer: Any, group: str, message: dict[str, Any]) -> None:
    global _drainer
    _outbox.append((layer, group, message))
    if _drainer is None or _drainer.done():
        _drainer = asyncio.get_running_loop().create_task(_drain())


async def _drain() -> None:
    while _outbox:
        layer, group, message = _outbox.popleft()
        try:
            await layer.group_send(group, message)
        except Exception:
            logger.exception("could not publish %s to %s", message["event"], group)
