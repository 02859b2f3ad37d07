"""The conversation socket against the real ASGI application: who may connect, which events arrive, and
that nothing is sent before the data it describes is committed.

Each test is sync and drives one async scenario through async_to_sync; REST calls go through the real views
with sync_to_async. Transactions are real (transaction=True), so on_commit fires as it does in production.
The same tests run on the in-memory channel layer and, with REDIS_URL set, on channels_redis."""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import channel_layers, get_channel_layer
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.conf import settings
from django.db import connection, transaction

from config.asgi import application
from conversations.consumers import CLOSE_NOT_FOUND, CLOSE_UNAUTHORIZED
from conversations.models import Message
from tenants.services import api_key_create, api_key_revoke

pytestmark = pytest.mark.django_db(transaction=True)

QUIET = 0.2  # how long a socket must stay silent for "nothing arrives"
EVENT_TIMEOUT = 2  # generous upper bound; an event normally arrives in milliseconds
UNKNOWN_KEY = "mnemo_abcdefgh_" + "x" * 40  # well-formed, never issued


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    """A new layer per test: every test runs its own event loop, and a layer's queues and Redis pools belong
    to the loop that created them."""
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        try:
            await scenario()
        finally:
            close_pools = getattr(get_channel_layer(), "close_pools", None)
            if close_pools is not None:
                await close_pools()

    async_to_sync(main)()


def socket_to(
    conversation_id: Any,
    *,
    key: str | None = None,
    header: str | None = None,
    query: str = "",
    subprotocols: list[str] | None = None,
):
    if key is not None:
        header = f"Bearer {key}"
    headers = [(b"authorization", header.encode())] if header is not None else []
    return WebsocketCommunicator(
        application,
        f"/ws/conversations/{conversation_id}/{query}",
        headers=headers,
        subprotocols=subprotocols,
    )


@asynccontextmanager
async def open_socket(conversation_id: Any, **credentials: str) -> AsyncIterator[WebsocketCommunicator]:
    socket = socket_to(conversation_id, **credentials)
    connected, code = await socket.connect()
    assert connected, f"socket refused with {code}"
    try:
        yield socket
    finally:
        await socket.disconnect()


async def refusal_code(conversation_id: Any, **credentials: Any) -> int | None:
    """The close code of a refused socket. It is refused after the handshake: a close before it reaches a
    real client as a bare HTTP 403 without the code (test_websocket_server.py checks with a real server)."""
    socket = socket_to(conversation_id, **credentials)
    connected, _ = await socket.connect()
    assert connected, "refused before the handshake: a client would see HTTP 403, not the close code"
    closed = await socket.receive_output(timeout=EVENT_TIMEOUT)
    await socket.disconnect()
    assert closed["type"] == "websocket.close"
    return closed["code"]


async def api(client, method: str, path: str, data: Any = None, *, expect: int) -> dict:
    response = await sync_to_async(getattr(client, method))(path, data, format="json")
    assert response.status_code == expect, response.content
    return response.json()


async def append(actor, conversation, content: str, **fields: Any) -> dict:
    url = f"/api/v1/conversations/{conversation.id}/messages"
    return await api(actor.client, "post", url, {"role": "user", "content": content, **fields}, expect=201)


async def next_event(socket: WebsocketCommunicator) -> dict:
    return await socket.receive_json_from(timeout=EVENT_TIMEOUT)


def event(kind: str, conversation, data: dict) -> dict:
    return {"type": kind, "conversation_id": str(conversation.id), "data": data}


# --- who may connect ---------------------------------------------------------------------------------------


def test_runs_on_the_configured_channel_layer():
    expected = "RedisChannelLayer" if settings.REDIS_URL else "InMemoryChannelLayer"
    assert type(get_channel_layer()).__name__ == expected


def test_owner_connects_with_a_header_or_a_query_key(owner, conversation):
    async def scenario():
        async with open_socket(conversation.id, key=owner.raw_key) as socket:
            await append(owner, conversation, "by header")
            assert (await next_event(socket))["data"]["content"] == "by header"
        async with open_socket(conversation.id, query=f"?api_key={owner.raw_key}") as socket:
            await append(owner, conversation, "by query")
            assert (await next_event(socket))["data"]["content"] == "by query"

    run(scenario)


def test_owner_connects_with_the_subprotocol_token_and_the_answer_never_echoes_it(owner, conversation):
    async def scenario():
        socket = socket_to(conversation.id, subprotocols=["mnemo", f"mnemo.bearer.{owner.raw_key}"])
        connected, subprotocol = await socket.connect()
        assert (connected, subprotocol) == (True, "mnemo")
        try:
            await append(owner, conversation, "by subprotocol")
            assert (await next_event(socket))["data"]["content"] == "by subprotocol"
        finally:
            await socket.disconnect()

    run(scenario)


def test_unknown_socket_paths_are_closed_with_4404(owner):
    async def scenario():
        socket = WebsocketCommunicator(
            application, "/ws/nothing-here/", headers=[(b"authorization", f"Bearer {owner.raw_key}".encode())]
        )
        assert (await socket.connect())[0]
        assert await socket.receive_output(timeout=EVENT_TIMEOUT) == {
            "type": "websocket.close",
            "code": CLOSE_NOT_FOUND,
        }
        await socket.disconnect()

    run(scenario)


@pytest.mark.parametrize(
    "credentials",
    [
        pytest.param({}, id="no-key"),
        pytest.param({"subprotocols": ["mnemo", "mnemo.bearer.not-a-key"]}, id="malformed-subprotocol-key"),
        pytest.param(
            {"subprotocols": ["mnemo", f"mnemo.bearer.{UNKNOWN_KEY}"]}, id="unknown-subprotocol-key"
        ),
        pytest.param({"header": "Basic dXNlcjpwdw=="}, id="not-bearer"),
        pytest.param({"header": "Bearer "}, id="empty-bearer"),
        pytest.param({"key": "not-a-key"}, id="malformed-key"),
        pytest.param({"key": UNKNOWN_KEY}, id="unknown-key"),
        pytest.param({"query": "?api_key=not-a-key"}, id="malformed-query-key"),
        pytest.param({"query": f"?api_key={UNKNOWN_KEY}"}, id="unknown-query-key"),
    ],
)
def test_socket_without_a_valid_key_is_closed(conversation, credentials):
    async def scenario():
        assert await refusal_code(conversation.id, **credentials) == CLOSE_UNAUTHORIZED

    run(scenario)


def test_revoked_key_is_closed(owner, conversation):
    api_key_revoke(api_key=owner.api_key)

    async def scenario():
        assert await refusal_code(conversation.id, key=owner.raw_key) == CLOSE_UNAUTHORIZED
        assert await refusal_code(conversation.id, query=f"?api_key={owner.raw_key}") == CLOSE_UNAUTHORIZED

    run(scenario)


@pytest.mark.parametrize(
    "conversation_id",
    [
        pytest.param("5f0c6e64-7a51-4b8e-9c83-2d1f0e9a7b10", id="unknown"),
        pytest.param("not-a-uuid", id="malformed"),
        pytest.param("1", id="integer"),
    ],
)
def test_unknown_or_malformed_conversation_is_closed(owner, conversation_id):
    async def scenario():
        assert await refusal_code(conversation_id, key=owner.raw_key) == CLOSE_NOT_FOUND

    run(scenario)


def test_outsider_socket_on_the_owners_conversation_is_closed_and_hears_nothing(
    owner, outsider, conversation
):
    async def scenario():
        intruder = socket_to(conversation.id, key=outsider.raw_key)
        assert (await intruder.connect())[0]
        assert await intruder.receive_output(timeout=EVENT_TIMEOUT) == {
            "type": "websocket.close",
            "code": CLOSE_NOT_FOUND,
        }
        async with open_socket(conversation.id, key=owner.raw_key) as socket:
            await append(owner, conversation, "private")
            assert (await next_event(socket))["type"] == "message.appended"
        # The refused socket never joined the conversation's group.
        assert await intruder.receive_nothing(QUIET)
        await intruder.disconnect()

    run(scenario)


# --- what a connected owner receives -----------------------------------------------------------------------


def test_owner_receives_each_event_with_the_rest_representation(owner, conversation):
    base = f"/api/v1/conversations/{conversation.id}"

    async def scenario():
        async with open_socket(conversation.id, key=owner.raw_key) as socket:
            turn = await api(owner.client, "post", f"{base}/turns", expect=201)
            assert await next_event(socket) == event("turn.started", conversation, turn)
            assert turn["status"] == "active"

            message = await append(
                owner, conversation, "Half a repl", role="assistant", completed=False, metadata={"k": 1}
            )
            appended = await next_event(socket)
            assert appended == event("message.appended", conversation, message)
            stored = await sync_to_async(Message.objects.get)(conversation=conversation, seq=1)
            assert {
                k: appended["data"][k] for k in ("id", "seq", "role", "content", "completed", "turn_id")
            } == {
                "id": str(stored.id),
                "seq": 1,
                "role": "assistant",
                "content": "Half a repl",
                "completed": False,
                "turn_id": turn["id"],
            }

            patch = {"content": "Half a reply, finished", "completed": True}
            updated = await api(owner.client, "patch", f"{base}/messages/{message['id']}", patch, expect=200)
            assert await next_event(socket) == event("message.updated", conversation, updated)
            assert (updated["content"], updated["completed"]) == ("Half a reply, finished", True)

            ended = await api(owner.client, "post", f"{base}/turns/{turn['id']}/end", expect=200)
            assert await next_event(socket) == event("turn.ended", conversation, ended)
            assert ended["status"] == "ended"

            # Ending an ended turn changes nothing and says nothing.
            await api(owner.client, "post", f"{base}/turns/{turn['id']}/end", expect=200)
            assert await socket.receive_nothing(QUIET)

    run(scenario)


def test_starting_a_turn_ends_the_active_one_first(owner, conversation):
    url = f"/api/v1/conversations/{conversation.id}/turns"

    async def scenario():
        async with open_socket(conversation.id, key=owner.raw_key) as socket:
            first = await api(owner.client, "post", url, expect=201)
            await next_event(socket)
            second = await api(owner.client, "post", url, expect=201)
            ended, started = await next_event(socket), await next_event(socket)
            assert (ended["type"], ended["data"]["id"], ended["data"]["status"]) == (
                "turn.ended",
                first["id"],
                "ended",
            )
            assert started == event("turn.started", conversation, second)

    run(scenario)


def test_batch_append_sends_one_event_per_message_in_seq_order(owner, conversation):
    url = f"/api/v1/conversations/{conversation.id}/messages"
    batch = {"messages": [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]}

    async def scenario():
        async with open_socket(conversation.id, key=owner.raw_key) as socket:
            body = await api(owner.client, "post", url, batch, expect=201)
            first, second = await next_event(socket), await next_event(socket)
            assert [first["data"], second["data"]] == body["messages"]
            assert [first["data"]["seq"], second["data"]["seq"]] == [1, 2]
            assert await socket.receive_nothing(QUIET)

    run(scenario)


def test_idempotent_replay_sends_no_second_event(owner, conversation):
    url = f"/api/v1/conversations/{conversation.id}/messages"
    data = {"role": "user", "content": "once", "idempotency_key": "k-1"}

    async def scenario():
        async with open_socket(conversation.id, key=owner.raw_key) as socket:
            first = await api(owner.client, "post", url, data, expect=201)
            assert (await next_event(socket))["data"]["id"] == first["id"]
            assert (await api(owner.client, "post", url, data, expect=200))["id"] == first["id"]
            assert await socket.receive_nothing(QUIET)

    run(scenario)


def test_socket_is_read_only(owner, conversation):
    async def scenario():
        async with open_socket(conversation.id, key=owner.raw_key) as socket:
            await socket.send_json_to({"role": "user", "content": "sneaky"})
            reply = await next_event(socket)
            assert (reply["type"], reply["data"]["code"]) == ("error", "read_only")
        assert not await sync_to_async(Message.objects.filter(conversation=conversation).exists)()

    run(scenario)


# --- never before the commit -------------------------------------------------------------------------------


class _RolledBack(Exception):
    pass


def test_event_of_a_rolled_back_transaction_is_never_delivered(owner, conversation):
    url = f"/api/v1/conversations/{conversation.id}/messages"

    def append_then_roll_back() -> None:
        try:
            with transaction.atomic():
                response = owner.client.post(url, {"role": "user", "content": "discarded"}, format="json")
                assert response.status_code == 201
                raise _RolledBack
        except _RolledBack:
            pass
        assert not Message.objects.filter(conversation=conversation).exists()

    async def scenario():
        async with open_socket(conversation.id, key=owner.raw_key) as socket:
            await sync_to_async(append_then_roll_back)()
            assert await socket.receive_nothing(QUIET)
            # The socket is alive: the next committed write is the first thing it hears.
            await append(owner, conversation, "kept")
            heard = await next_event(socket)
            assert (heard["type"], heard["data"]["content"], heard["data"]["seq"]) == (
                "message.appended",
                "kept",
                1,
            )

    run(scenario)


def test_nothing_arrives_while_the_transaction_is_open(owner, conversation):
    url = f"/api/v1/conversations/{conversation.id}/messages"
    observed: dict[str, Any] = {}

    def append_inside_an_open_transaction(socket: WebsocketCommunicator) -> None:
        # Runs on a thread and connection of its own, so that the consumer's database work (on the main
        # thread) is free to deliver anything sent too early.
        try:
            with transaction.atomic():
                response = owner.client.post(url, {"role": "user", "content": "pending"}, format="json")
                assert response.status_code == 201
                observed["message_id"] = response.json()["id"]
                observed["quiet_while_open"] = async_to_sync(socket.receive_nothing)(QUIET)
        finally:
            connection.close()

    async def scenario():
        async with open_socket(conversation.id, key=owner.raw_key) as socket:
            await sync_to_async(append_inside_an_open_transaction, thread_sensitive=False)(socket)
            assert observed["quiet_while_open"] is True
            heard = await next_event(socket)
            assert (heard["type"], heard["data"]["id"]) == ("message.appended", observed["message_id"])
            assert await sync_to_async(Message.objects.filter(pk=observed["message_id"]).exists)()

    run(scenario)


# --- isolation and revocation ------------------------------------------------------------------------------


def test_outsider_on_its_own_conversation_hears_nothing_of_the_owners(
    owner, outsider, conversation, outsider_conversation
):
    async def scenario():
        async with (
            open_socket(outsider_conversation.id, key=outsider.raw_key) as outsider_socket,
            open_socket(conversation.id, key=owner.raw_key) as owner_socket,
        ):
            await api(owner.client, "post", f"/api/v1/conversations/{conversation.id}/turns", expect=201)
            await append(owner, conversation, "owner's")
            heard = [(await next_event(owner_socket))["type"] for _ in range(2)]
            assert heard == ["turn.started", "message.appended"]
            assert await outsider_socket.receive_nothing(QUIET)
            # ...while it does hear its own conversation, and the owner does not.
            await append(outsider, outsider_conversation, "outsider's")
            own = await next_event(outsider_socket)
            assert (own["conversation_id"], own["data"]["content"]) == (
                str(outsider_conversation.id),
                "outsider's",
            )
            assert await owner_socket.receive_nothing(QUIET)

    run(scenario)


def test_revoking_the_key_of_a_connected_socket_closes_it_at_the_next_event(owner, conversation):
    # The socket uses a second key of the owner tenant, so the REST writer keeps a valid one.
    socket_key, socket_raw_key = api_key_create(tenant=owner.tenant, name="socket")

    async def scenario():
        async with open_socket(conversation.id, key=socket_raw_key) as socket:
            await append(owner, conversation, "before")
            assert (await next_event(socket))["data"]["content"] == "before"

            await sync_to_async(api_key_revoke)(api_key=socket_key)
            await append(owner, conversation, "after")
            closed = await socket.receive_output(timeout=EVENT_TIMEOUT)
            assert closed == {"type": "websocket.close", "code": CLOSE_UNAUTHORIZED}
            assert await socket.receive_nothing(QUIET)

    run(scenario)


@pytest.mark.skipif(not settings.REDIS_URL, reason="only the Redis channel layer has a read timeout")
def test_idle_socket_outlives_the_redis_read_timeout(owner, conversation):
    async def scenario():
        async with open_socket(conversation.id, key=owner.raw_key) as socket:
            await asyncio.sleep(6)  # one blocking read (5 s) and a margin: the idle time is the subject
            await append(owner, conversation, "still there?")
            assert (await next_event(socket))["data"]["content"] == "still there?"

    run(scenario)


# --- the server's own HTTP path ----------------------------------------------------------------------------


def test_appends_over_the_servers_http_path_reach_the_socket_in_order(owner, conversation):
    """HTTP runs on the server's request threads (config/asgi.py); their events are handed to the server's
    event loop, which owns the sockets (and the in-memory layer's queues), and leave in order."""

    async def post(content: str) -> int:
        body = json.dumps({"role": "user", "content": content}).encode()
        request = HttpCommunicator(
            application,
            "POST",
            f"/api/v1/conversations/{conversation.id}/messages",
            body=body,
            headers=[
                (b"host", b"testserver"),
                (b"authorization", f"Bearer {owner.raw_key}".encode()),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        )
        return (await request.get_response(timeout=EVENT_TIMEOUT))["status"]

    async def scenario():
        async with open_socket(conversation.id, key=owner.raw_key) as socket:
            assert [await post(text) for text in ("one", "two", "three")] == [201, 201, 201]
            received = [(await next_event(socket))["data"]["content"] for _ in range(3)]
            assert received == ["one", "two", "three"]
            assert await socket.receive_nothing(timeout=QUIET)

    run(scenario)


def test_a_body_without_a_length_is_refused_with_411(owner, conversation):
    """Django's WSGI handler reads Content-Length bytes; a chunked body without it would read as empty."""

    async def scenario():
        request = HttpCommunicator(
            application,
            "POST",
            f"/api/v1/conversations/{conversation.id}/messages",
            body=b'{"role": "user", "content": "hi"}',
            headers=[
                (b"host", b"testserver"),
                (b"authorization", f"Bearer {owner.raw_key}".encode()),
                (b"transfer-encoding", b"chunked"),
            ],
        )
        response = await request.get_response(timeout=EVENT_TIMEOUT)
        assert response["status"] == 411
        assert json.loads(response["body"])["error"]["code"] == "length_required"

    run(scenario)
    assert not Message.objects.filter(conversation=conversation).exists()


def test_a_server_whose_receive_and_send_return_plain_awaitables_is_served(owner, conversation):
    """granian's receive and send return awaitables that are not coroutines; a2wsgi hands them to
    run_coroutine_threadsafe, and every request with a body got an HTML 500 there."""
    body = b'{"role": "user", "content": "hi"}'
    sent: list[dict[str, Any]] = []

    def done(value: Any) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        future.set_result(value)
        return future

    async def scenario():
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": f"/api/v1/conversations/{conversation.id}/messages",
            "raw_path": f"/api/v1/conversations/{conversation.id}/messages".encode(),
            "query_string": b"",
            "root_path": "",
            "server": ("testserver", 80),
            "client": ("127.0.0.1", 50000),
            "headers": [
                (b"host", b"testserver"),
                (b"authorization", f"Bearer {owner.raw_key}".encode()),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
        await application(
            scope,
            lambda: done({"type": "http.request", "body": body, "more_body": False}),
            lambda message: sent.append(message) or done(None),
        )

    run(scenario)
    assert sent[0]["status"] == 201
    assert Message.objects.filter(conversation=conversation, content="hi").exists()
