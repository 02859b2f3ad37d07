"""API building blocks every app's views use: size-capped parsers that refuse hostile JSON
(tenants/validation.py), serializers that refuse fields they do not know, and a boolean field that takes
only true or false."""

from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import ErrorDetail, ParseError, ValidationError
from rest_framework.parsers import BaseParser, JSONParser, MultiPartParser

from tenants.errors import ApplicationError
from tenants.validation import HostileInput, json_loads


def _too_large(limit: int) -> ApplicationError:
    return ApplicationError(
        f"The request body is larger than {limit} bytes.",
        code="request_too_large",
        status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        extra={"limit_bytes": limit},
    )


def read_limited(stream: Any) -> bytes:
    """The request body, refused with 413 request_too_large past DATA_UPLOAD_MAX_MEMORY_SIZE. DRF's parsers
    read the raw stream and so skip Django's own check of that setting."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    raw = stream.read(limit + 1) if stream is not None else b""
    if len(raw) > limit:
        raise _too_large(limit)
    return raw


def json_body(raw: bytes | str) -> Any:
    """A JSON body (or a form field holding JSON) as the API takes it: 400 malformed_json when it is not
    JSON, and the codes of tenants/validation.py when it is hostile (too deep, NUL, lone surrogate)."""
    try:
        return json_loads(raw)
    except HostileInput as exc:
        raise exc.api_error() from None
    except ValueError as exc:
        raise ParseError(f"JSON parse error - {exc}") from None


class LimitedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = read_limited(stream)
        body: bytes | str = raw
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        if encoding.lower().replace("-", "") != "utf8":
            try:
                body = raw.decode(encoding)
            except (LookupError, ValueError) as exc:
                raise ParseError(f"JSON parse error - {exc}") from None
        return json_body(body)


class LimitedMultiPartParser(MultiPartParser):
    """Multipart bodies (image uploads) held to the same limit as JSON ones, from Content-Length before a
    byte is read: Django counts only a form's text fields against DATA_UPLOAD_MAX_MEMORY_SIZE, so an upload
    of any size was read (to memory or a temporary file) before the image check refused it."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        meta = parser_context["request"].META if parser_context else {}
        try:
            length = int(meta.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0  # Django reads no body without a valid Content-Length either
        if length > limit:
            raise _too_large(limit)
        return super().parse(stream, media_type, parser_context)


class RawBodyParser(BaseParser):
    """The body as bytes, whatever its media type (JSON Lines has no registered one), size-capped."""

    media_type = "*/*"

    # DRF makes request.data whatever a parser returns; its stubs type that a mapping only.
    def parse(  # type: ignore[override]
        self, stream: Any, media_type: str | None = None, parser_context: Any = None
    ) -> bytes:
        return read_limited(stream)


def _wrong_type(field: serializers.Field, value: Any) -> bool:
    """A value DRF would coerce although its JSON type is not the field's: a number or a boolean for text
    (0 -> "0"), a boolean for a number (false -> 0.0). Query strings hold text only, so this holds for them
    too."""
    if isinstance(field, serializers.ListField) and isinstance(value, list):
        return any(_wrong_type(field.child, item) for item in value)
    if isinstance(field, serializers.CharField):
        return not isinstance(value, str | None)
    numeric = serializers.IntegerField | serializers.FloatField | serializers.DecimalField
    return isinstance(field, numeric) and isinstance(value, bool)


class StrictSerializer(serializers.Serializer):
    """Unknown fields are an error, not silently ignored: a typo in a field name must not pass as a
    request that did something else. Nor is a value of the wrong JSON type that DRF would coerce."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise ValidationError(
                    {key: [ErrorDetail("Unknown field.", code="unknown_field")] for key in unknown}
                )
            self._check_raw(data)
        return super().to_internal_value(data)

    def _check_raw(self, data: dict[str, Any]) -> None:
        """The values as sent, before DRF coerces or trims them: of the field's JSON type, and text within
        max_length as sent (DRF counts after trimming whitespace; the schema's maxLength is the input's)."""
        errors: dict[str, list[ErrorDetail]] = {}
        for name, field in self.fields.items():
            if name not in data:
                continue
            value, limit = data[name], getattr(field, "max_length", None)
            if _wrong_type(field, value):
                errors[name] = [ErrorDetail("Wrong JSON type for this field.", code="invalid")]
            elif isinstance(value, str) and limit is not None and len(value) > limit:
                message = f"Ensure this field has no more than {limit} characters."
                errors[name] = [ErrorDetail(message, code="max_length")]
        if errors:
            raise ValidationError(errors)


class StrictBooleanField(serializers.BooleanField):
    """A JSON true or false. BooleanField also takes 0, 1, "yes", "off"…, so a number sent where a boolean
    belongs would pass as something the client did not say."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


def optional_body(request: Any) -> Any:
    """The body of an endpoint whose body may be left out: no body is {}; a JSON null or a list stays
    what it is, for the serializer to refuse (only an object is a body)."""
    data = request.data
    return {} if isinstance(data, dict) and not data else data


def validated(serializer_class: type[serializers.Serializer], data: Any, **kwargs: Any) -> Any:
    serializer = serializer_class(data=data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


# --- documented error responses (the one error shape) ----------------------------------------------------

ERROR_SCHEMA = inline_serializer(
    "Error",
    {
        "error": inline_serializer(
            "ErrorBody",
            {
                "code": serializers.CharField(),
                "message": serializers.CharField(),
                "extra": serializers.DictField(),
            },
        )
    },
)
ERROR_RESPONSES = {
    400: OpenApiResponse(ERROR_SCHEMA, description="Invalid input (code names the problem)"),
    401: OpenApiResponse(ERROR_SCHEMA, description="Missing or invalid API key"),
    404: OpenApiResponse(ERROR_SCHEMA, description="No such object in your tenant"),
}
CONFLICT_RESPONSES = {409: OpenApiResponse(ERROR_SCHEMA, description="Conflicts with the stored state")}


class DegradationSerializer(serializers.Serializer):
    """A fallback a response reports (the context call by stage, memory writes and searches without one)."""

    stage = serializers.CharField(required=False)
    code = serializers.CharField()
    message = serializers.CharField()


def cursor_page(name: str, item: type[serializers.Serializer]) -> serializers.Serializer:
    """The schema of a list answered in pages by a CursorPagination: follow `next` until it is null."""
    return inline_serializer(
        name,
        {
            "next": serializers.URLField(allow_null=True, help_text="The next page; null on the last."),
            "previous": serializers.URLField(allow_null=True),
            "results": item(many=True),
        },
    )


def error_responses(*extra_codes: dict[int, OpenApiResponse]) -> dict[int, OpenApiResponse]:
    """Documented error responses of an endpoint: 400/401/404 plus any extra."""
    merged = dict(ERROR_RESPONSES)
    for codes in extra_codes:
        merged.update(codes)
    return merged
