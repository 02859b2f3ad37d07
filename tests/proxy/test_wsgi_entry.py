"""The chat proxy under the WSGI entry point (config.wsgi, which production serves with granian's WSGI
workers), through a real threaded WSGI server on 127.0.0.1: replies stream chunk by chunk, concurrent streams
all finish, a client that goes away leaves its partial reply, errors keep the SDK's shape."""

import io
import json
import socketserver
import threading
from collections.abc import Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.util import setup_testing_defaults

import httpx
import pytest
from django.db import connection

from conversations.models import Message
from tests.proxy.conftest import assert_interrupted_by_client, assistant_reply, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class _ThreadedWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def wsgi_url(proxy_settings) -> Iterator[str]:
    from config.wsgi import application

    httpd = make_server(
        "127.0.0.1", 0, application, server_class=_ThreadedWSGIServer, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _stream(url: str, key: str, content: str, **headers: str) -> tuple[int, str, str]:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": content}], "stream": True}
    headers = {"Authorization": f"Bearer {key}", **headers}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=20) as r:
        text = "".join(r.iter_text())
    return r.status_code, text, r.headers.get("x-mnemo-conversation", "")


def _replies(conversation_id: str) -> list[tuple[str, bool]]:
    return list(
        Message.objects.filter(conversation_id=conversation_id, role="assistant").values_list(
            "content", "completed"
        )
    )


def _all_finished_and_stored(results: list[tuple[int, str, str]]) -> None:
    for status, text, conversation_id in results:
        assert status == 200
        assert '"error"' not in text
        assert text.rstrip().endswith("data: [DONE]")
        assert wait_for(lambda c=conversation_id: _replies(c) == [("one two three four", True)])


def test_streams_one_after_another_all_finish(owner, wsgi_url, llm_server):
    llm_server.reply = "one two three four"
    _all_finished_and_stored([_stream(wsgi_url, owner.raw_key, f"question {n}") for n in range(12)])


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the tests' in-memory SQLite locks whole tables"
)
def test_concurrent_streams_all_finish_and_are_stored(owner, wsgi_url, llm_server):
    llm_server.reply = "one two three four"
    results: list[tuple[int, str, str]] = []

    def one(n: int) -> None:
        results.append(_stream(wsgi_url, owner.raw_key, f"question {n}", **{"X-Mnemo-User": f"user-{n}"}))

    threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(results) == 8
    _all_finished_and_stored(results)


def test_chunks_reach_the_client_before_the_upstream_finishes(owner, wsgi_url, llm_server):
    """The upstream pauses after three events; they reach the client all the same (not buffered)."""
    llm_server.reply = "aaaa bbbb cccc dddd"
    llm_server.script("pause")
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "go"}], "stream": True}
    headers = {"Authorization": f"Bearer {owner.raw_key}"}
    try:
        with httpx.stream(
            "POST", f"{wsgi_url}/v1/chat/completions", json=body, headers=headers, timeout=5
        ) as r:
            lines = r.iter_lines()
            first = [line for line in (next(lines) for _ in range(6)) if line]
            assert len(first) == 3 and '"bbbb "' in first[2]
            llm_server.release.set()
            rest = "\n".join(lines)
    finally:
        llm_server.release.set()
    assert '"dddd"' in rest and rest.rstrip().endswith("data: [DONE]")


def _chat_environ(key: str, payload: bytes, stream: io.BytesIO) -> dict:
    """A WSGI environ for a chat completion with this body, read from `stream`."""
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/v1/chat/completions",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(payload)),
        "HTTP_AUTHORIZATION": f"Bearer {key}",
        "wsgi.input": stream,
    }
    setup_testing_defaults(environ)
    return environ


def test_a_body_closed_mid_stream_leaves_a_partial_reply(owner, proxy_settings, llm_server):
    """What a WSGI server does when a write to a client that went away fails: it closes the body. The
    proxy is told at once and stores what was said, marked as interrupted by the client."""
    from config.wsgi import application

    llm_server.reply = "aaaa bbbb cccc dddd"
    llm_server.script("pause")
    payload = json.dumps(
        {"model": "gpt-4o", "messages": [{"role": "user", "content": "go"}], "stream": True}
    ).encode()
    environ = _chat_environ(owner.raw_key, payload, io.BytesIO(payload))
    started: list[tuple[str, list[tuple[str, str]]]] = []
    try:
        body = application(environ, lambda status, headers, *_: started.append((status, headers)))
        chunks = iter(body)
        assert [b'"bbbb "' in next(chunks) for _ in range(3)] == [False, False, True]
        body.close()
        assert started[0][0] == "200 OK"
        conversation_id = {k.lower(): v for k, v in started[0][1]}["x-mnemo-conversation"]
        partial = assistant_reply(conversation_id)
    finally:
        llm_server.release.set()
    assert_interrupted_by_client(partial, "aaaa bbbb ")


def test_non_streaming_and_errors_keep_the_sdk_shape(owner, outsider, wsgi_url, llm_server):
    llm_server.reply = "Paris."
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Capital of France?"}]}
    answer = httpx.post(
        f"{wsgi_url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {owner.raw_key}"}
    )
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == "Paris."
    refused = httpx.post(
        f"{wsgi_url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"}
    )
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    # Another tenant's key does not reach this tenant's conversation.
    stolen = httpx.post(
        f"{wsgi_url}/v1/chat/completions",
        json=body,
        headers={
            "Authorization": f"Bearer {outsider.raw_key}",
            "X-Mnemo-Conversation": answer.headers["x-mnemo-conversation"],
        },
    )
    assert stolen.status_code == 404 and stolen.json()["error"]["code"] == "conversation_not_found"
    unknown = httpx.get(f"{wsgi_url}/v1/nowhere", headers={"Authorization": f"Bearer {owner.raw_key}"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"


def test_a_handler_that_fails_before_answering_gets_the_sdks_500(caplog):
    """A failure outside the proxy's own error handling still answers JSON in the SDK's shape, with the
    request id it is logged under, never the WSGI server's plain page."""
    from context.proxy.wsgi import ProxyOnWSGI

    async def broken(scope, receive, send):
        raise RuntimeError("boom")

    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/v1/messages", "wsgi.input": io.BytesIO(b"")}
    setup_testing_defaults(environ)
    started: list[tuple[str, list[tuple[str, str]]]] = []
    body = b"".join(
        ProxyOnWSGI(broken)(environ, lambda status, headers, *_: started.append((status, headers)))
    )
    status, headers = started[0]
    payload = json.loads(body)
    request_id = {k.lower(): v for k, v in headers}["x-request-id"]
    assert status == "500 Internal Server Error"
    assert payload["type"] == "error" and payload["error"]["code"] == "internal_error"  # Anthropic's shape
    assert payload["request_id"] == request_id
    assert any(request_id in r.getMessage() and r.exc_info for r in caplog.records)


class _CountingInput(io.BytesIO):
    """wsgi.input that records how many bytes the application asked for."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.taken = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.taken += len(chunk)
        return chunk


def test_a_body_over_the_limit_is_refused_without_reading_it_whole(owner, proxy_settings, llm_server):
    """The bridge reads no more than one byte past MNEMO_MAX_REQUEST_BYTES before the view's 413."""
    from config.wsgi import application

    proxy_settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    text = "x" * 100_000
    data = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}).encode()
    stream = _CountingInput(data)
    environ = _chat_environ(owner.raw_key, data, stream)
    started: list[tuple[str, list[tuple[str, str]]]] = []
    body = b"".join(application(environ, lambda status, headers, *_: started.append((status, headers))))
    assert started[0][0].startswith("413")
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert stream.taken <= 2048 + 1
    assert not Message.objects.exists() and llm_server.requests == []
