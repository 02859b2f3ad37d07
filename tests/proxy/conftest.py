"""The proxy through a real server (uvicorn on 127.0.0.1 serving config.asgi, as deployed) and the real SDK
clients, with the upstream a real HTTP server on 127.0.0.1 (tests/llm_server.py) that records what it got."""

import time
from collections.abc import Iterator

import pytest

from tests.llm_server import llm_server, llm_settings  # noqa: F401

UPSTREAM_KEY = "sk-upstream-secret-0123456789"


@pytest.fixture
def proxy_settings(llm_settings, llm_server):  # noqa: F811
    """The platform's upstream is the test server, for both formats, with a key the tests look for."""
    llm_settings.LLM_API_KEY = UPSTREAM_KEY
    llm_settings.ANTHROPIC_BASE_URL = llm_server.base_url.removesuffix("/v1")
    llm_settings.ANTHROPIC_API_KEY = UPSTREAM_KEY
    llm_settings.MNEMO_PROXY_DEADLINE_SECONDS = 5
    from context.proxy import upstream

    upstream._http_client.cache_clear()
    upstream._openai_clients.clear()
    yield llm_settings
    upstream._http_client.cache_clear()
    upstream._openai_clients.clear()


@pytest.fixture
def mnemo_url(proxy_settings) -> Iterator[str]:
    """uvicorn serving config.asgi on a free port (the socket tests' server); yields the base URL the SDKs
    are pointed at."""
    from tests.conversations.test_websocket_server import server

    with server() as ws_url:
        yield "http" + ws_url.removeprefix("ws")


def wait_for(predicate, *, timeout: float = 10.0):
    """Poll until predicate() is truthy (what the server does after answering lands a moment later). The
    in-memory SQLite of `make test` is shared between threads with table locks: a read that meets the
    server's write is tried again."""
    from django.db import OperationalError

    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except OperationalError:
            value = None
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def assistant_reply(conversation_id):
    """The conversation's first assistant message once the server has stored it (None if it never does)."""
    from conversations.models import Message

    return wait_for(lambda: Message.objects.filter(conversation_id=conversation_id, role="assistant").first())


def assert_interrupted_by_client(partial, text: str) -> None:
    assert partial is not None
    assert (partial.content, partial.completed) == (text, False)
    assert partial.metadata["interrupted"] == "client_disconnected"
