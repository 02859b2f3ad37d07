"""The one application error type and the DRF handler that renders every error as
{"error": {"code", "message", "extra", "request_id"}}; the request id every API response carries."""

import logging
import re
import uuid
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import (
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.http import Http404, HttpRequest
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response


class ApplicationError(Exception):
    """A refusal the client can act on: a stable machine-readable code, a sentence, optional details."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status_code: int = status.HTTP_400_BAD_REQUEST,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status_code = status_code
        self.extra = extra or {}


def error_body(code: str, message: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "extra": extra or {}}}


REQUEST_ID_HEADER = "X-Request-Id"
# A gateway's own id is kept when it looks like one, so its logs and ours name the same request; anything
# else (too long, control characters) is replaced rather than written into our logs and headers.
_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# The attribute of Django's request that keeps its id (HttpRequest declares no such field; the log filter
# config.errors.RequestIdInLog reads it back by this name).
REQUEST_ID_ATTRIBUTE = "request_id"


def request_id_assign(request: HttpRequest | Request) -> str:
    """The request's id: the caller's X-Request-Id when well-formed, else a new one; kept on the request."""
    # DRF's Request: the id lives on Django's.
    django_request = request._request if isinstance(request, Request) else request
    existing = getattr(django_request, REQUEST_ID_ATTRIBUTE, None)
    if existing:
        return str(existing)
    offered = django_request.headers.get(REQUEST_ID_HEADER, "")
    request_id = offered if _CLIENT_REQUEST_ID.fullmatch(offered) else f"req_{uuid.uuid4().hex}"
    setattr(django_request, REQUEST_ID_ATTRIBUTE, request_id)
    return request_id


def _detail_with_codes(detail: Any) -> Any:
    if isinstance(detail, dict):
        return {key: _detail_with_codes(value) for key, value in detail.items()}
    if isinstance(detail, list):
        return [_detail_with_codes(item) for item in detail]
    return {"code": getattr(detail, "code", "invalid"), "message": str(detail)}


def _first_error(detail: Any, path: tuple[str, ...] = ()) -> tuple[tuple[str, ...], Any] | None:
    """Depth-first first error, so the top-level code names the actual problem (e.g. invalid_role)."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            found = _first_error(value, (*path, str(key)))
            if found:
                return found
        return None
    if isinstance(detail, list):
        for index, item in enumerate(detail):
            sub_path = path if not isinstance(item, dict | list) else (*path, str(index))
            found = _first_error(item, sub_path)
            if found:
                return found
        return None
    return path, detail


_STATUS_CODES = {
    exceptions.ParseError: "malformed_json",
    exceptions.AuthenticationFailed: "invalid_api_key",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
}


def _suspicious(exc: SuspiciousOperation) -> Response:
    """A request Django's parsers refuse (too many files or fields in a form, a malformed multipart body):
    the 400 Django would send as an HTML page, in the API's shape, logged where Django logs it."""
    logging.getLogger(f"django.security.{exc.__class__.__name__}").warning("%s", exc)
    if isinstance(exc, TooManyFilesSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FILES
        body = error_body("too_many_files", f"A request carries at most {limit} files.", {"limit": limit})
    elif isinstance(exc, TooManyFieldsSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        body = error_body("too_many_fields", f"A request carries at most {limit} fields.", {"limit": limit})
    else:
        body = error_body("bad_request", "The request could not be read.")
    return Response(body, status=status.HTTP_400_BAD_REQUEST)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = _handled(exc)
    request = context.get("request")
    if response is not None and request is not None and isinstance(response.data, dict):
        response.data["error"]["request_id"] = request_id_assign(request)
    return response


def _handled(exc: Exception) -> Response | None:
    if isinstance(exc, ApplicationError):
        return Response(error_body(exc.code, exc.message, exc.extra), status=exc.status_code)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        return Response(
            error_body("request_too_large", "The request body is larger than this server accepts."),
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    elif isinstance(exc, SuspiciousOperation):
        return _suspicious(exc)

    if isinstance(exc, exceptions.ValidationError):
        first = _first_error(exc.detail)
        if first is None:
            code, message = "invalid", "The request is invalid."
        else:
            path, detail = first
            code = getattr(detail, "code", None) or "invalid"
            where = ".".join(p for p in path if p != "non_field_errors")
            message = f"{where}: {detail}" if where else str(detail)
        return Response(
            error_body(code, message, {"fields": _detail_with_codes(exc.detail)}),
            status=status.HTTP_400_BAD_REQUEST,
        )

    if isinstance(exc, exceptions.APIException):
        known = next((c for cls, c in _STATUS_CODES.items() if isinstance(exc, cls)), None)
        api_code = known or exc.default_code
        headers = {}
        # As DRF's own handler: the view sets auth_header on the exception, Throttled carries wait.
        auth_header = getattr(exc, "auth_header", None)
        if auth_header:
            headers["WWW-Authenticate"] = auth_header
        wait = getattr(exc, "wait", None)
        if wait:
            headers["Retry-After"] = str(int(wait))
        return Response(error_body(api_code, str(exc.detail)), status=exc.status_code, headers=headers)
    return None
