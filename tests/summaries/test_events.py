"""Compaction events on the conversation socket, against the real ASGI application and the configured
channel layer (in-memory, or Redis with REDIS_URL): compaction.started, the records as message.appended,
summary.updated, compaction.completed; compaction.failed when it fails; nothing for the outsider."""

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import channel_layers, get_channel_layer
from channels.testing import WebsocketCommunicator

from config.asgi import application
from conversations.events import events_flush
from summaries.services import compaction as compaction_module
from summaries.services.compaction import write as compaction_write
from tests.summaries.helpers import history

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 3


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    # Each test runs its own event loop; a layer's queues and Redis pools belong to the loop that made them.
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def run(scenario) -> None:
    async def main() -> None:
        try:
            await scenario()
        finally:
            close_pools = getattr(get_channel_layer(), "close_pools", None)
            if close_pools is not None:
                await close_pools()

    async_to_sync(main)()


def socket(conversation, key: str) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {key}".encode())]
    return WebsocketCommunicator(application, f"/ws/conversations/{conversation.id}/", headers=headers)


async def events_until(sock: WebsocketCommunicator, last: str) -> list[dict]:
    received = []
    while True:
        event = await sock.receive_json_from(timeout=TIMEOUT)
        received.append(event)
        if event["type"] == last:
            return received


def test_a_compaction_is_announced_on_the_socket(owner, conversation):
    history(conversation, 20)
    # With channels_redis the appends' events leave from the publisher loop: out before the socket joins.
    events_flush()

    async def scenario():
        sock = socket(conversation, owner.raw_key)
        assert (await sock.connect())[0]
        try:
            response = await sync_to_async(owner.client.post)(
                f"/api/v1/conversations/{conversation.id}/compact", {}, format="json"
            )
            assert response.status_code == 200
            body = response.json()
            events = await events_until(sock, "compaction.completed")
        finally:
            await sock.disconnect()
        assert [e["type"] for e in events] == [
            "compaction.started",
            "message.appended",
            "message.appended",
            "summary.updated",
            "compaction.completed",
        ]
        assert events[1]["data"]["kind"] == "compact_boundary"
        assert events[2]["data"]["kind"] == "compact_summary"
        assert events[3]["data"]["reason"] == "compaction"
        assert events[3]["data"]["segment"]["id"] == body["segment"]["id"]
        assert events[4]["data"]["tokens_after"] == body["tokens_after"]
        assert events[0]["data"]["mode"] == "sync"

    run(scenario)


def test_a_failed_compaction_is_announced_and_the_outsider_hears_nothing(
    owner, outsider, conversation, monkeypatch
):
    history(conversation, 20)
    # With channels_redis the appends' events leave from the publisher loop: out before the socket joins.
    events_flush()

    def broken(**kwargs):
        raise RuntimeError("storage offline")

    monkeypatch.setattr(compaction_write, "compaction_records_append", broken)

    async def scenario():
        sock = socket(conversation, owner.raw_key)
        assert (await sock.connect())[0]
        foreign = socket(conversation, outsider.raw_key)
        # Refused after the handshake (so a client gets the code), before joining the conversation's group.
        assert (await foreign.connect())[0]
        assert await foreign.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4404}
        await foreign.disconnect()
        try:
            with pytest.raises(RuntimeError):
                await sync_to_async(compaction_module.compaction_run)(
                    conversation=conversation, trigger="auto", sync=False
                )
            events = await events_until(sock, "compaction.failed")
        finally:
            await sock.disconnect()
        assert [e["type"] for e in events] == ["compaction.started", "compaction.failed"]
        assert events[1]["data"]["error"] == "RuntimeError"
        assert events[1]["data"]["message"] == "storage offline"

    run(scenario)
