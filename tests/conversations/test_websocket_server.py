"""The conversation socket through a real server (uvicorn on 127.0.0.1, config.asgi, as `make run` and the
deployment in docs/operations.md serve it) and a real client (the websockets package): what a client
actually receives when it is refused, the subprotocol token, and what the server's own log lines say about
the key."""

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import uvicorn
from channels.layers import channel_layers
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from config.asgi import application
from conversations.consumers import CLOSE_NOT_FOUND, CLOSE_UNAUTHORIZED

pytestmark = pytest.mark.django_db(transaction=True)

UNKNOWN_KEY = "mnemo_abcdefgh_" + "x" * 40


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    """The handshake and the logs are the subject here, not the layer: its queues belong to the server's
    loop, which ends with each test."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@contextmanager
def server() -> Iterator[str]:
    """uvicorn serving config.asgi on a free port, its loggers left to propagate (log_config=None) so the
    test's log capture sees the lines it writes; yields the ws:// base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(application, lifespan="off", log_config=None, access_log=True)
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not instance.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"ws://127.0.0.1:{port}"
    finally:
        instance.should_exit = True
        thread.join(timeout=10)
        sock.close()


def close_code(url: str, **options) -> int | None:
    """Connect and wait for the server to close; the close code the client received."""
    with (
        connect(url, open_timeout=5, close_timeout=2, **options) as ws,
        pytest.raises(ConnectionClosed) as closed,
    ):
        ws.recv(timeout=5)
    return closed.value.rcvd.code if closed.value.rcvd else None


def test_a_real_client_receives_4401_and_4404(owner, outsider, conversation):
    path = f"/ws/conversations/{conversation.id}/"
    with server() as base:
        assert close_code(base + path) == CLOSE_UNAUTHORIZED
        assert close_code(base + path, additional_headers={"Authorization": f"Bearer {UNKNOWN_KEY}"}) == 4401
        assert close_code(base + f"{path}?api_key={UNKNOWN_KEY}") == CLOSE_UNAUTHORIZED
        outsider_key = {"Authorization": f"Bearer {outsider.raw_key}"}
        assert close_code(base + path, additional_headers=outsider_key) == CLOSE_NOT_FOUND
        owner_key = {"Authorization": f"Bearer {owner.raw_key}"}
        assert close_code(base + "/ws/conversations/nope/", additional_headers=owner_key) == CLOSE_NOT_FOUND
        # A browser-style client that offered subprotocols gets "mnemo" back even when refused, so it
        # completes the handshake and sees the code.
        assert (
            close_code(base + path, subprotocols=["mnemo", f"mnemo.bearer.{UNKNOWN_KEY}"])
            == CLOSE_UNAUTHORIZED
        )


def test_the_subprotocol_token_authenticates_and_is_not_echoed(owner, conversation):
    with server() as base:
        url = f"{base}/ws/conversations/{conversation.id}/"
        with connect(url, subprotocols=["mnemo", f"mnemo.bearer.{owner.raw_key}"], open_timeout=5) as ws:
            assert ws.subprotocol == "mnemo"
            ws.send('{"type": "ping"}')
            assert '"read_only"' in ws.recv(timeout=5)  # accepted: the socket answers (it only pushes)
            assert owner.raw_key not in str(ws.response.headers)


def test_the_servers_log_lines_do_not_carry_the_query_key(owner, conversation, caplog):
    caplog.set_level(logging.INFO)
    with server() as base:
        url = f"{base}/ws/conversations/{conversation.id}/?api_key={owner.raw_key}"
        with connect(url, open_timeout=5) as ws:
            ws.send('{"type": "ping"}')
            ws.recv(timeout=5)
        assert close_code(f"{base}/ws/conversations/{conversation.id}/?x=1&api_key={UNKNOWN_KEY}") == 4401
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("uvicorn")]
    socket_lines = [line for line in lines if "WebSocket" in line]
    assert socket_lines, lines  # uvicorn did log the sockets' paths
    assert all("api_key=[redacted]" in line for line in socket_lines), socket_lines
    secret = owner.raw_key.split("_")[2]
    assert secret not in caplog.text and UNKNOWN_KEY not in caplog.text
