"""Django's ASGI handler for the proxy's async views, without the middleware chain: the API-key views need
none of it (sessions, CSRF, auth, messages, admin lockouts), and under ASGI every synchronous middleware hook
is a hop to a worker thread and back, twice per middleware, on each request."""

from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response


class ProxyASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)  # type: ignore[attr-defined]
