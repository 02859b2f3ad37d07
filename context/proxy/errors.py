"""Errors of the proxy in the shape each SDK expects: OpenAI's {"error": {message, type, param, code}} and
Anthropic's {"type": "error", "error": {type, message}}, with Mnemo's machine-readable code in both."""

import json
from typing import Any

from django.http import HttpRequest, JsonResponse

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class ProxyError(Exception):
    """A refusal or an upstream failure: status, a stable code, a sentence safe to show the client (it never
    carries the upstream key or URL), and headers to send (retry-after)."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.param = param
        self.headers = headers or {}


def error_payload(exc: ProxyError, fmt: str, *, request_id: str | None = None) -> dict[str, Any]:
    """With a request id (a failure logged under it) the body names it: at the top level for Anthropic, as
    its API does, and inside the error object for OpenAI."""
    if fmt == "anthropic":
        kind = _ANTHROPIC_TYPES.get(exc.status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": exc.message, "code": exc.code}}
        if request_id:
            body["request_id"] = request_id
        return body
    kind = _OPENAI_TYPES.get(exc.status, "server_error")
    error = {"message": exc.message, "type": kind, "param": exc.param, "code": exc.code}
    if request_id:
        error["request_id"] = request_id
    return {"error": error}


def proxy_format(request: HttpRequest) -> str:
    """The SDK a /v1/ request speaks, for an error raised before its view knew: Anthropic's for /v1/messages
    and for a request that sends anthropic-version, OpenAI's otherwise."""
    if request.path.rstrip("/").endswith("/messages") or request.headers.get("anthropic-version"):
        return "anthropic"
    return "openai"


def error_response(exc: ProxyError, fmt: str) -> JsonResponse:
    response = JsonResponse(error_payload(exc, fmt), status=exc.status)
    for name, value in exc.headers.items():
        response[name] = value
    return response


def error_event(exc: ProxyError, fmt: str) -> bytes:
    """The error as a server-sent event, for a failure after the stream started (both SDKs raise on it)."""
    data = json.dumps(error_payload(exc, fmt))
    if fmt == "anthropic":
        return f"event: error\ndata: {data}\n\n".encode()
    return f"data: {data}\n\n".encode()
