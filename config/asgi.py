"""ASGI entry point: HTTP through Django's WSGI handler on a fixed pool of threads, WebSockets through
Channels under /ws/, both in one server process.

The API's views are synchronous (DRF). Under Django's ASGI handler every request would get a thread of its
own, created and joined per request, and hop between the event loop and that thread once per middleware; on
two cores that cost as much as the view itself (bench/append.py). a2wsgi runs the plain WSGI handler on
reused threads instead, and the event loop only carries bytes."""

import asyncio
import json
import os
import time
from typing import Any

from a2wsgi import WSGIMiddleware
from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.wsgi import get_wsgi_application

# A server runs with production settings unless told otherwise (debug off; a secret key and the allowed
# hosts from the environment). Development opts in: manage.py and `make run` name config.django.local.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.django.production")

# Django must be set up before anything imports models (the WebSocket routes do).
django_wsgi_app = get_wsgi_application()

from config.lanes import FOREGROUND_PATH  # noqa: E402
from config.log_redaction import redact_server_logs  # noqa: E402
from config.ops import RECEIVED  # noqa: E402

redact_server_logs()  # uvicorn logs a socket's path with its ?api_key=

from config.startup import server_started  # noqa: E402

server_started()  # the embedding model loads in the background; the embedded mode runs its own beat

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from context.proxy.asgi import PROXY_PREFIX, ProxyASGIHandler  # noqa: E402
from conversations.events import events_bind_loop  # noqa: E402
from conversations.routing import websocket_urlpatterns  # noqa: E402


class ThreadedHttp:
    """HTTP requests on MNEMO_HTTP_THREADS reused threads, context calls on MNEMO_HTTP_FOREGROUND_THREADS of
    their own: the other requests step aside for them (providers.lanes), and one that stepped aside still
    holds its thread, so a context call queued behind it would wait for the call it stepped aside for. The
    server's event loop is handed to the event publisher, so events raised on those threads reach this
    process's sockets (and the in-memory channel layer, whose queues belong to this loop)."""

    def __init__(self, wsgi_app: Any, threads: int, foreground_threads: int) -> None:
        # Static files (the admin's, Swagger UI's) are answered before Django's middleware.
        # django-stubs type the handler's __call__ as returning a response, the WSGI body iterable it is.
        self.app = WSGIMiddleware(StaticFilesHandler(wsgi_app), workers=threads)  # type: ignore[arg-type]
        self.foreground_app = WSGIMiddleware(wsgi_app, workers=foreground_threads)
        # The chat proxy's async views (/v1/) stream a reply as it arrives: Django's ASGI handler runs them.
        self.async_app = ProxyASGIHandler()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        events_bind_loop(asyncio.get_running_loop())
        if scope.get("path", "").startswith(PROXY_PREFIX):
            await self.async_app(scope, receive, send)
            return
        # Noted for the request's Server-Timing (config.ops): how long it then waits for a thread.
        scope = {**scope, RECEIVED: time.perf_counter()}
        headers = dict(scope.get("headers") or ())
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower() and b"content-length" not in headers:
            # The WSGI handler reads Content-Length bytes: a chunked body would arrive empty.
            await _refuse_length_required(send)
            return
        app = self.foreground_app if FOREGROUND_PATH.fullmatch(scope.get("path", "")) else self.app
        await app(scope, _coroutine(receive), _coroutine(send))


def _coroutine(channel: Any) -> Any:
    """The server's receive or send as a coroutine function. a2wsgi hands what they return to
    asyncio.run_coroutine_threadsafe, which takes nothing else; granian's return other awaitables, and every
    request with a body got an HTML 500 ("A coroutine object is required")."""

    async def call(*args: Any) -> Any:
        return await channel(*args)

    return call


async def _refuse_length_required(send: Any) -> None:
    body = json.dumps(
        {
            "error": {
                "code": "length_required",
                "message": "Send the body with a Content-Length header (a chunked body is not read).",
                "extra": {},
            }
        }
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 411, "headers": headers})
    await send({"type": "http.response.body", "body": body})


application = ProtocolTypeRouter(
    {
        "http": ThreadedHttp(
            django_wsgi_app, settings.MNEMO_HTTP_THREADS, settings.MNEMO_HTTP_FOREGROUND_THREADS
        ),
        # No Origin check: sockets authenticate with an API key, not a cookie, so a foreign page cannot
        # ride on a user's session; non-browser clients send no Origin at all.
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
