"""The chat proxy's async views under a WSGI server (config/wsgi.py, granian's WSGI workers in production).

Django's WSGI handler runs an async view on an event loop of its own for the call and then drains a streamed
reply on another one, all before sending a byte: the reply arrived at once instead of chunk by chunk, and
the upstream connection, opened on the first loop, failed on the second for a share of the streams
("could not be reached"). Here every /v1/ request runs on one event loop per process, as under the ASGI
entry point: the WSGI thread waits for the response's start, then hands on each chunk as the view sends it.
A body the server closes early (it found the client gone when a write failed) is told to the view as an
ASGI disconnect, so the reply is stored as it stood (context/proxy/views.py), as under ASGI."""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from http import HTTPStatus
from typing import Any

from a2wsgi.asgi import build_scope
from django.conf import settings
from django.core.handlers.wsgi import WSGIRequest

from context.proxy.errors import ProxyError, error_payload, proxy_format
from tenants.errors import REQUEST_ID_HEADER, request_id_assign

logger = logging.getLogger("mnemo.errors")

StartResponse = Callable[..., Any]
_END = {"type": "mnemo.end"}  # the view returned (or raised): nothing more will be sent


class ProxyOnWSGI:
    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app  # an ASGI application (context.proxy.asgi.ProxyASGIHandler)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The process's loop for these views, started on first use: after the server forks its workers,
        so each worker has a thread of its own running it."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="mnemo-proxy-loop", daemon=True).start()
            return self._loop

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterator[bytes]:
        loop = self.loop()
        body = _request_body(environ)
        sent: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        gone = asyncio.Event()
        scope = build_scope(environ)  # type: ignore[arg-type]  # a2wsgi types the environ as a TypedDict
        future = asyncio.run_coroutine_threadsafe(self._serve(scope, body, sent, gone), loop)
        start = sent.get()
        if start.get("type") != "http.response.start":  # the handler ended without answering
            start, failed = _internal_error(future, environ)
            sent.put({"type": "http.response.body", "body": failed})
        start_response(_status(start["status"]), _headers(start.get("headers", [])))
        return self._body(sent, lambda: loop.call_soon_threadsafe(gone.set))

    async def _serve(
        self, scope: Any, body: bytes, sent: queue.SimpleQueue[dict[str, Any]], gone: asyncio.Event
    ) -> None:
        received = False

        async def receive() -> dict[str, Any]:
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            # Never waits for the client: what can pile up is one model reply for a client reading slowly.
            sent.put(message)

        try:
            await self.app(scope, receive, send)
        finally:
            sent.put(_END)

    @staticmethod
    def _body(sent: queue.SimpleQueue[dict[str, Any]], disconnect: Callable[[], Any]) -> Iterator[bytes]:
        finished = False
        try:
            while True:
                message = sent.get()
                if message is _END:
                    finished = True
                    return
                if message.get("type") == "http.response.body":
                    yield message.get("body", b"")
                    if not message.get("more_body", False):
                        finished = True
                        return
        finally:
            if not finished:  # the server closed the body early: the client went away
                disconnect()


def _request_body(environ: dict[str, Any]) -> bytes:
    """The body as Django's WSGI request would read it, but never more than one byte past
    DATA_UPLOAD_MAX_MEMORY_SIZE: the view refuses a larger one by its Content-Length (413), so a client
    cannot make the worker hold an upload of any size before that."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except (ValueError, TypeError):
        length = 0
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is not None:
        length = min(length, limit + 1)
    return environ["wsgi.input"].read(length) if length > 0 else b""


def _internal_error(future: Future[None], environ: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """The proxy's handler answers its own errors in the SDK's shape; this is for a failure outside it,
    answered and logged the same way (context/proxy/asgi.py)."""
    try:
        error = future.exception(timeout=5)
    except Exception as exc:  # still running, or cancelled
        error = exc
    request = WSGIRequest(environ)
    request_id = request_id_assign(request)
    logger.error(
        "unhandled error on %s %s (request_id=%s)", request.method, request.path, request_id, exc_info=error
    )
    failed = ProxyError(
        "Mnemo failed on this request; it is logged under its request id.", code="internal_error", status=500
    )
    body = json.dumps(error_payload(failed, proxy_format(request), request_id=request_id)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (REQUEST_ID_HEADER.encode(), request_id.encode()),
    ]
    return {"type": "http.response.start", "status": 500, "headers": headers}, body


def _status(code: int) -> str:
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return f"{code} Unknown"


def _headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in raw]
