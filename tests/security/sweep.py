"""The outsider sweep's machinery: the operations of the OpenAPI schema, every place an operation names an
object (path and query parameters, headers, body fields), and how an answer is compared with another.

Which parameter or field names an object is read from the schema: a path parameter always does; a query
parameter, header or body field does when its name says so (`…_id`, `…_ids`, a uuid, or one of the names
below). The kind of object comes from the name too. A name the sweep does not know fails the sweep until it
is added here, as naming an object or as a plain value, so the sweep grows with the API."""

import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# Kinds of objects. An id kind names one object by an id unique across tenants: another tenant's id must be
# answered as an id nobody has (404 in the path, 400 or 404 in a body). A name kind is a name each tenant
# has its own of (an end user's external id, a memory block's label, a client's idempotency key): another
# tenant's name must be answered as a name never used, whatever that answer is.
ID_KINDS = {"conversation", "message", "turn", "image", "profile", "document", "memory", "context"}
NAME_KINDS = {"user", "label", "idempotency", "request", "target", "source"}

# Parameter and field names whose kind is not their name without `_id`.
NAMED_KINDS = {
    "end_user": "user",
    "external_id": "user",
    "label": "label",
    "agent_profile": "profile",
    "profile_id": "profile",
    "user_message_id": "message",
    "parent_id": "message",
    # Recorded with a memory as the client gives them and never looked up: only compared with the ids of
    # the caller's own messages a prompt shows.
    "source_message_ids": "source",
    "request_id": "request",
    "idempotency_key": "idempotency",
    "Idempotency-Key": "idempotency",
    "target": "target",  # a filter on the caller's own memory-operation log: a memory's id or a label
}
# Names that look like references (or are free text) and name no object.
PLAIN_NAMES = {
    "limit",
    "cursor",  # a position in the caller's own list
    "after",
    "after_seq",
    "all",
    "q",
    "kind",
    "kinds",
    "scope",
    "status",
    "group_by",
    "since",
    "until",
    "include_invalidated",
    "If-Match",  # a version number of the caller's own block
}


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    operation_id: str
    path_params: tuple[str, ...]
    query_params: tuple[tuple[str, dict[str, Any]], ...]  # (name, schema)
    header_params: tuple[tuple[str, dict[str, Any]], ...]
    content_type: str | None
    body_schema: dict[str, Any] | None
    json_schema: dict[str, Any] | None = None  # the body's schema as JSON, when JSON is one of its types


@dataclass(frozen=True)
class Ref:
    """One place an operation names an object: where ("path", "query", "header", "body"), the parameter's
    name or the body field's path, and the kind of object."""

    where: str
    name: str
    kind: str
    path: tuple[str | int, ...] = ()
    wrap: Callable[[str], Any] | None = field(default=None, compare=False)


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    if "allOf" in node and len(node["allOf"]) == 1:
        return {**resolve(schema, node["allOf"][0]), **{k: v for k, v in node.items() if k != "allOf"}}
    return node


def operations(schema: dict[str, Any]) -> list[Operation]:
    """Every operation of the schema, once per content type its body may have."""
    found = []
    for path, item in schema["paths"].items():
        for method, op in item.items():
            params = op.get("parameters", [])
            content = op.get("requestBody", {}).get("content", {})
            for content_type in content or [None]:
                found.append(
                    Operation(
                        method=method.upper(),
                        path=path,
                        operation_id=op["operationId"],
                        path_params=tuple(p["name"] for p in params if p["in"] == "path"),
                        query_params=_params(params, "query"),
                        header_params=_params(params, "header"),
                        content_type=content_type,
                        body_schema=content[content_type]["schema"] if content_type else None,
                        json_schema=content.get("application/json", {}).get("schema"),
                    )
                )
    return found


def _params(params: list[dict[str, Any]], where: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    return tuple((p["name"], p.get("schema", {})) for p in params if p["in"] == where)


def form_field(schema: dict[str, Any], op: Operation) -> str | None:
    """The one text field of a multipart body that carries the operation's JSON body (beside the files it
    names), when it has one: its references are the JSON body's."""
    if op.content_type != "multipart/form-data" or op.json_schema is None or op.body_schema is None:
        return None
    node = resolve(schema, op.body_schema)
    required = node.get("required", [])
    fields = node.get("properties", {})
    if len(required) == 1 and len(fields) == 1 and fields[required[0]].get("type") == "string":
        return required[0]
    return None


class Unknown(Exception):
    """A parameter or field the sweep cannot classify: teach it (NAMED_KINDS or PLAIN_NAMES)."""


def kind_of(name: str, node: dict[str, Any] | None = None, *, always: bool = False) -> str | None:
    """The kind of object a parameter or field names, None for a plain value; Unknown when it looks like a
    reference (or is a path parameter) of a kind the sweep does not know."""
    if name in PLAIN_NAMES:
        return None
    if name in NAMED_KINDS:
        return NAMED_KINDS[name]
    if name in ID_KINDS:
        return name
    node = node or {}
    uuid_like = node.get("format") == "uuid" or node.get("items", {}).get("format") == "uuid"
    stem = re.sub(r"_ids?$", "", name)
    if always or uuid_like or stem != name:
        if stem in ID_KINDS:
            return stem
        raise Unknown(f"{name!r}: which object does it name?")
    return None


def image_parts(value: str) -> list[dict[str, Any]]:
    return [{"type": "image", "image_id": value, "detail": "high"}]


def body_refs(schema: dict[str, Any], node: dict[str, Any], path: tuple[Any, ...] = ()) -> Iterator[Ref]:
    """The body fields that name objects, walked through nested objects and lists of objects. A message's
    `parts` name images (image parts with an image_id)."""
    node = resolve(schema, node)
    if "properties" not in node and node.get("oneOf"):
        node = resolve(schema, node["oneOf"][0])  # one shape of the body is enough to reach its fields
    for name, prop in node.get("properties", {}).items():
        prop = resolve(schema, prop)
        where = (*path, name)
        if name == "parts" and prop.get("type") == "array":
            yield Ref("body", ".".join(map(str, where)) + "[].image_id", "image", where, image_parts)
            continue
        kind = kind_of(name, prop)
        if kind is not None:
            listed = prop.get("type") == "array"
            yield Ref("body", ".".join(map(str, where)), kind, where, (lambda v: [v]) if listed else None)
        elif prop.get("type") == "object" and "properties" in prop:
            yield from body_refs(schema, prop, where)
        elif prop.get("type") == "array" and "properties" in resolve(schema, prop.get("items", {})):
            yield from body_refs(schema, prop["items"], (*where, 0))


def refs(schema: dict[str, Any], op: Operation) -> list[Ref]:
    found = [Ref("path", name, kind_of(name, always=True) or "") for name in op.path_params]
    for where, names in (("query", op.query_params), ("header", op.header_params)):
        found += [Ref(where, n, kind) for n, node in names if (kind := kind_of(n, node)) is not None]
    if form_field(schema, op) is not None:
        found += list(body_refs(schema, op.json_schema or {}))
    elif op.body_schema is not None and op.content_type != "application/x-ndjson":
        found += list(body_refs(schema, op.body_schema))
    return found


def random_value(kind: str) -> str:
    """A well-formed value of this kind that names nothing."""
    if kind == "image":
        return "img_" + uuid.uuid4().hex[:24]
    if kind in ID_KINDS:
        return str(uuid.uuid4())
    return f"nobody-{uuid.uuid4().hex[:12]}"


# --- answers -----------------------------------------------------------------------------------------------

# Headers whose value differs between two requests for reasons of their own.
_VOLATILE_HEADERS = {"content-length", "server-timing", "date", "x-mnemo-conversation", "etag"}


def body_bytes(response: Any) -> bytes:
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content)
    return response.content


def _shape(value: Any) -> Any:
    """The structure of a JSON value: keys and types, not values (a new object has a new id and time)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def _without(text: str, sent: list[str]) -> str:
    for value in sent:
        text = text.replace(value, "<sent>")
    return text


def answer(response: Any, body: bytes, sent: list[str]) -> tuple[Any, ...]:
    """What must be alike for a real id and a random one: the status, the header names, and the body (the
    values sent replaced by a placeholder): all of it for an error, its shape for a success."""
    text = _without(body.decode("utf-8", "replace"), sent)
    try:
        parsed: Any = json.loads(text)
    except ValueError:
        parsed = text
    if response.status_code < 400:
        parsed = _shape(parsed)
    elif isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        parsed["error"].pop("request_id", None)  # each request's own id, in every error body
    headers = sorted(k.lower() for k in response.headers if k.lower() not in _VOLATILE_HEADERS)
    return response.status_code, headers, parsed


def leaks(response: Any, body: bytes, markers: set[str], sent: list[str] | None = None) -> list[str]:
    """The markers found in the body or the headers, apart from the values the request sent (an answer may
    name what it was asked about)."""
    headers = "\n".join(f"{k}: {v}" for k, v in response.headers.items())
    haystack = _without(body.decode("utf-8", "replace") + "\n" + headers, sent or [])
    return sorted(m for m in markers if m in haystack)
