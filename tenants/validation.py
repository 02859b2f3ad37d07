"""Hostile input, refused with a 400 before it reaches a column: JSON nested too deep, NUL characters and
lone surrogates in any string of a JSON body (PostgreSQL's text and jsonb cannot hold them), numbers no
column or JSON document holds, and identifiers longer than the column they are looked up in."""

import json
import math
import re
from typing import Any

from rest_framework.exceptions import ErrorDetail, ValidationError

from tenants.errors import ApplicationError

# Deeper JSON is refused before anything recursive (the parser, parts validation, task-state events, the
# database driver's JSON encoding) walks it.
MAX_JSON_DEPTH = 32
# What integer columns hold: IntegerField/PositiveIntegerField are 32-bit on PostgreSQL, the Big variants
# (and SQLite's INTEGER) 64-bit.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

NULL_CHARACTERS = "null_characters_not_allowed"
SURROGATE_CHARACTERS = "surrogate_characters_not_allowed"

# The codes and sentences DRF's CharField uses, so a NUL is refused with one code whatever field holds it.
_BAD_CHARACTER = re.compile("[\x00\ud800-\udfff]")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(range(256)).translate(None, b"[]{}")
_EMPTY_PAIR = re.compile(rb"\[\]|\{\}")
_BRACKET_RUN = re.compile(rb"[\[{]+|[\]}]+")


class HostileInput(Exception):
    """Input refused before it is used: `code` is the API's error code, `path` where in the JSON it is."""

    def __init__(
        self, message: str, *, code: str, path: tuple[str, ...] = (), extra: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.path = path
        self.extra = extra or {}

    def api_error(self) -> Exception:
        """A field error (extra.fields) when it lies inside the document, else an ApplicationError."""
        if not self.path:
            return ApplicationError(self.message, code=self.code, extra=self.extra)
        detail: Any = [ErrorDetail(self.message, code=self.code)]
        for key in reversed(self.path):
            detail = {key: detail}
        return ValidationError(detail)


def text_problem(value: str) -> tuple[str, str] | None:
    """(code, sentence) when the text holds a character no column stores, else None."""
    found = _BAD_CHARACTER.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return NULL_CHARACTERS, "Null characters are not allowed."
    return SURROGATE_CHARACTERS, f"Surrogate characters are not allowed: U+{ord(found.group()):X}."


def text_is_clean(value: object, *, max_length: int | None) -> bool:
    """Whether a path identifier could name a stored row: a string of 1..max_length characters (any length
    when the column has no max_length) that a text column can hold. Anything else is a 404 without a query
    (PostgreSQL refuses a NUL even in a WHERE)."""
    return (
        isinstance(value, str)
        and len(value) > 0
        and (max_length is None or len(value) <= max_length)
        and text_problem(value) is None
    )


def json_depth_check(raw: bytes, *, limit: int = MAX_JSON_DEPTH) -> None:
    """HostileInput json_too_deep when the document nests arrays and objects deeper than `limit`, found
    from the brackets outside strings, before anything parses it."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return
    skeleton = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    # Each pass drops the innermost empty pairs, so a balanced skeleton loses exactly one level; passes that
    # halve it (wide, shallow documents) are cheaper than the scan below, which is quick on deep ones.
    removed = 0
    while skeleton and removed < limit:
        shorter = _EMPTY_PAIR.sub(b"", skeleton)
        if len(shorter) * 2 > len(skeleton):
            break
        skeleton, removed = shorter, removed + 1
    depth = 0
    for run in _BRACKET_RUN.finditer(skeleton):
        width = run.end() - run.start()
        if skeleton[run.start()] in b"[{":
            depth += width
            if depth + removed > limit:
                raise HostileInput(
                    f"The JSON is nested deeper than {limit} levels.",
                    code="json_too_deep",
                    extra={"limit_depth": limit},
                )
        else:
            depth -= width


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise HostileInput(f"The number {text[:40]} is out of range.", code="number_out_of_range")
    return value


def _strict_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def json_check(value: Any, *, path: tuple[str, ...] = (), depth: int = 0) -> None:
    """HostileInput for a NUL or lone surrogate in any string or key, a non-finite number, or nesting
    deeper than MAX_JSON_DEPTH, naming where it is."""
    if isinstance(value, str):
        problem = text_problem(value)
        if problem is not None:
            raise HostileInput(problem[1], code=problem[0], path=path)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise HostileInput("The number is out of range.", code="number_out_of_range", path=path)
    elif isinstance(value, dict | list):
        if depth >= MAX_JSON_DEPTH:
            raise HostileInput(
                f"The JSON is nested deeper than {MAX_JSON_DEPTH} levels.",
                code="json_too_deep",
                extra={"limit_depth": MAX_JSON_DEPTH},
            )
        if isinstance(value, list):
            for index, item in enumerate(value):
                json_check(item, path=(*path, str(index)), depth=depth + 1)
            return
        for key, item in value.items():
            if isinstance(key, str) and (problem := text_problem(key)) is not None:
                raise HostileInput(problem[1], code=problem[0], path=(*path, ascii(key)[1:-1]))
            json_check(item, path=(*path, str(key)), depth=depth + 1)


def json_loads(raw: bytes | str) -> Any:
    """A JSON document parsed for the API: HostileInput when it is too deep (checked before parsing), holds
    a NUL or a lone surrogate, or a number beyond a float (1e400); ValueError when it is not JSON (as
    json.loads, NaN and Infinity included)."""
    data = raw.encode() if isinstance(raw, str) else raw
    json_depth_check(data)
    text = data.decode("utf-8") if isinstance(raw, bytes) else raw
    try:
        value = json.loads(text, parse_float=_finite_float, parse_constant=_strict_constant)
    except RecursionError:  # not reached after the depth check; kept so it can never become a 500
        raise HostileInput(
            f"The JSON is nested deeper than {MAX_JSON_DEPTH} levels.",
            code="json_too_deep",
            extra={"limit_depth": MAX_JSON_DEPTH},
        ) from None
    # A NUL or a surrogate can only come from a \u escape: a raw NUL is invalid JSON and a raw surrogate
    # invalid UTF-8. Without one there is nothing to look for.
    if "\\u" in text:
        json_check(value)
    return value
