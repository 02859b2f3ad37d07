"""Events raised where no server loop runs (a WSGI server's workers, Celery workers) on a layer that reaches
other processes: handed to one loop on a thread of the process's own, in order, and sent before a
short-lived process exits."""

import threading
import time

import pytest

from conversations import events


class RecordingLayer:
    """Stands in for channels_redis: anything that is not the in-memory layer."""

    def __init__(self, fail_on: str = "") -> None:
        self.sent: list[tuple[str, str, str]] = []
        self.fail_on = fail_on

    async def group_send(self, group, message):
        if message["event"] == self.fail_on:
            raise ConnectionError("redis went away")
        self.sent.append((group, message["data"]["n"], threading.current_thread().name))


def message(n: str, event: str = "message.appended") -> dict:
    return {"type": "conversation.event", "event": event, "data": {"n": n}}


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def layer(monkeypatch):
    recording = RecordingLayer(fail_on="turn.ended")
    monkeypatch.setattr(events, "get_channel_layer", lambda: recording)
    # The publisher's loop makes a layer instance of its own: a fresh publisher, with this one.
    monkeypatch.setattr(events.channel_layers, "make_backend", lambda name: recording)
    # Both restored afterwards: a test after this one must not send on the recording layer (the publisher
    # returns its loop with the layer it made, and a restored loop would come back with this one).
    monkeypatch.setattr(events, "_publisher_loop", None)
    monkeypatch.setattr(events, "_publisher_layer", None)
    monkeypatch.setattr(events, "_server_loop", None)
    return recording


def test_events_from_many_threads_leave_in_order_on_one_publisher_loop(layer):
    def raise_events(prefix: str) -> None:
        for i in range(20):
            events._send("g", message(f"{prefix}{i:02d}"))

    threads = [threading.Thread(target=raise_events, args=(p,)) for p in "abc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wait_for(lambda: len(layer.sent) == 60)
    assert {name for _, _, name in layer.sent} == {"mnemo-events"}
    for prefix in "abc":
        # Each thread's events in the order it raised them.
        assert [n for _, n, _ in layer.sent if n[0] == prefix] == [f"{prefix}{i:02d}" for i in range(20)]


def test_a_failed_send_is_logged_and_the_next_events_still_go(layer, caplog):
    events._send("g", message("1"))
    events._send("g", message("lost", event="turn.ended"))
    events._send("g", message("2"))
    wait_for(lambda: len(layer.sent) == 2)
    assert [n for _, n, _ in layer.sent] == ["1", "2"]
    wait_for(lambda: "could not publish turn.ended" in caplog.text)


def test_what_was_queued_is_sent_before_the_process_exits(layer):
    slow = []

    async def slow_send(group, msg):
        import asyncio

        await asyncio.sleep(0.2)
        slow.append(msg["data"]["n"])

    layer.group_send = slow_send
    events._send("g", message("last"))
    events.events_flush(timeout=5)
    assert slow == ["last"]
