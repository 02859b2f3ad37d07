"""Errors under /api/ and /v1/ in the API's JSON shape, whatever raised them: an unhandled exception (logged
with its traceback and the request id), an unknown URL, a method a plain Django view refuses, a request
Django itself turns away. Every response carries the request id in X-Request-Id. The admin and the other
pages keep Django's own error pages."""

import logging
from collections.abc import Callable

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.views.defaults import bad_request, server_error

from context.proxy.errors import ProxyError, error_payload, proxy_format
from tenants.errors import REQUEST_ID_ATTRIBUTE, REQUEST_ID_HEADER, request_id_assign

logger = logging.getLogger("mnemo.errors")

API_PREFIXES = ("/api/", "/v1/")

_STATUS_CODES = {
    400: "bad_request",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    429: "throttled",
}
_MESSAGES = {
    404: "No such endpoint.",
    405: "This endpoint does not take that method.",
    500: "The server failed on this request; it is logged under its request id.",
}


def is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIXES)


def api_error(request: HttpRequest, status: int, message: str | None = None) -> JsonResponse:
    """The error shape for a failure the API's own handler never saw. A /v1/ path answers in the shape of
    the SDK it speaks (context.proxy.errors)."""
    request_id = request_id_assign(request)
    code = _STATUS_CODES.get(status, "internal_error" if status >= 500 else "error")
    message = message or _MESSAGES.get(status, "The request failed.")
    if request.path.startswith("/v1/"):
        error = ProxyError(message, code=code, status=status)
        body = error_payload(error, proxy_format(request), request_id=request_id)
    else:
        body = {"error": {"code": code, "message": message, "extra": {}, "request_id": request_id}}
    response = JsonResponse(body, status=status)
    response[REQUEST_ID_HEADER] = request_id
    return response


def unhandled_log(request: HttpRequest, exc: BaseException) -> None:
    """The traceback, with the id the client got in its response."""
    logger.error(
        "unhandled error on %s %s (request_id=%s)",
        request.method,
        request.path,
        request_id_assign(request),
        exc_info=(type(exc), exc, exc.__traceback__),
    )


class RequestIdInLog(logging.Filter):
    """Django's own request log lines ("Internal Server Error: /api/…", with the traceback when a failure
    escaped every handler) name the request id the client got, so one search finds both."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = getattr(getattr(record, "request", None), REQUEST_ID_ATTRIBUTE, None)
        if request_id and isinstance(record.msg, str) and "request_id=" not in record.msg:
            record.msg = f"{record.msg} (request_id={request_id})"
        return True


def _is_json(response: HttpResponseBase) -> bool:
    return response.get("Content-Type", "").startswith("application/json")


class ApiErrorMiddleware:
    """Gives every request its id, answers an unhandled exception under /api/ and /v1/ with a JSON 500 (in
    place of Django's HTML page, the debug page included), and rewrites any other error response there that
    is not JSON (Django's 404 and 400 pages, a bare 405) into the error shape."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        request_id = request_id_assign(request)
        response = self.get_response(request)
        if response.status_code >= 400 and is_api(request) and not _is_json(response):
            response = api_error(request, response.status_code, _plain_message(response))
        response[REQUEST_ID_HEADER] = request_id
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not is_api(request):
            return None  # the admin and the pages: Django's handling
        if isinstance(exception, Http404):
            return api_error(request, 404, "Not found.")
        unhandled_log(request, exception)
        return api_error(request, 500)


def _plain_message(response: HttpResponseBase) -> str | None:
    """A short plain-text body (a view's own sentence) is kept as the message; an HTML page is not."""
    content = getattr(response, "content", b"")
    if not content or response.get("Content-Type", "").startswith("text/html") or len(content) > 300:
        return None
    try:
        text = content.decode()
    except UnicodeDecodeError:
        return None
    return text.strip() or None


def handler500(request: HttpRequest) -> HttpResponse:
    """A failure outside a view (a middleware's): under /api/ and /v1/ the JSON shape, elsewhere Django's."""
    if is_api(request):
        return api_error(request, 500)
    return server_error(request)


def handler400(request: HttpRequest, exception: Exception) -> HttpResponse:
    if is_api(request):
        return api_error(request, 400, "The request could not be read.")
    return bad_request(request, exception)
