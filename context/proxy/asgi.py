"""Django's ASGI handler for the proxy's async views, without the middleware chain: the API-key views need
none of it (sessions, CSRF, auth, messages, admin lockouts), and under ASGI every synchronous middleware hook
is a hop to a worker thread and back, twice per middleware, on each request. In their place one guard gives
each request its id and answers an unknown URL or an unhandled exception in the SDK's error shape, never
Django's HTML page."""

import logging
from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import Http404, HttpRequest, HttpResponseBase, JsonResponse

from context.proxy.errors import ProxyError, error_payload, proxy_format
from tenants.errors import REQUEST_ID_HEADER, request_id_assign

logger = logging.getLogger("mnemo.errors")

# The proxy's URLs (config/urls.py): the entry points hand these to ProxyASGIHandler.
PROXY_PREFIX = "/v1/"


class ProxyASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        self._middleware_chain = convert_exception_to_response(self._guarded)

    async def _guarded(self, request: HttpRequest) -> HttpResponseBase:
        request_id = request_id_assign(request)
        try:
            response: HttpResponseBase = await self._get_response_async(request)  # type: ignore[attr-defined]
        except Http404:
            response = _error(request, ProxyError("No such endpoint.", code="not_found", status=404))
        except Exception as exc:
            logger.error(
                "unhandled error on %s %s (request_id=%s)",
                request.method,
                request.path,
                request_id,
                exc_info=exc,
            )
            failed = ProxyError(
                "Mnemo failed on this request; it is logged under its request id.",
                code="internal_error",
                status=500,
            )
            response = _error(request, failed)
        response[REQUEST_ID_HEADER] = request_id
        return response


def _error(request: HttpRequest, exc: ProxyError) -> JsonResponse:
    body = error_payload(exc, proxy_format(request), request_id=request_id_assign(request))
    return JsonResponse(body, status=exc.status)
