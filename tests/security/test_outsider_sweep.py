"""Tenant isolation for every operation of the OpenAPI schema: the owner builds one of each object; the
outsider, with its own key and its own objects of each kind, calls every operation with the owner's id (or
name) in each place the operation names an object.

Every such request must be answered as the same request naming nothing (a random id): the same status, the
same headers, the same error; a 404 for an id in the path, a 400 or 404 for one in a body; and nothing of the
owner's (its marker text, its ids, its key) in the body or headers. Each request also runs with the
outsider's own object in that place and must succeed, which proves the refusal came from the reference.
Every request runs in a savepoint that is rolled back, so each one meets the same two worlds.

An operation the sweep cannot drive (a parameter or field it cannot classify, a body it cannot build, a
request that fails with the outsider's own objects) fails the sweep until it is taught here or in
tests/security/sweep.py. The worlds are built in tests/security/worlds.py; the socket and the chat proxy
are held to the same in test_outsider_socket_and_proxy.py."""

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from drf_spectacular.generators import SchemaGenerator

from tests.conftest import Actor
from tests.security import sweep
from tests.security.sweep import ID_KINDS, Operation, Ref
from tests.security.sweep import image_parts as sweep_parts
from tests.security.worlds import World, owner_markers

pytestmark = pytest.mark.django_db


# --- how to drive each operation ---------------------------------------------------------------------------


def _document(world: World) -> dict[str, Any]:
    upload = SimpleUploadedFile("more.md", f"More notes {uuid.uuid4().hex}".encode(), "text/markdown")
    return {"file": [upload]}


def _transcript(world: World) -> bytes:
    return json.dumps({"uuid": "a", "parentUuid": None, "role": "user", "content": "hello"}).encode()


def _state_event(world: World) -> dict[str, Any]:
    return {
        "expected_epoch": 1,
        "request_id": f"r-{uuid.uuid4().hex}",
        "event_type": "set",
        "payload": {"path": "step", "value": 2},
    }


# A valid body for each operation whose body has required fields (the others get an empty one): a new such
# operation answers 400 to its plain request until it is given one here.
BODIES: dict[str, Callable[[World], Any]] = {
    "agent_profiles_create": lambda w: {"name": f"p-{uuid.uuid4().hex[:8]}"},
    "conversations_messages_create": lambda w: {"role": "user", "content": "one more"},
    "conversations_context_create": lambda w: {"user_message": "What is planned?"},
    "conversations_state_events_create": _state_event,
    "conversations_usage_create": lambda w: {"usage": {"prompt_tokens": 10, "completion_tokens": 2}},
    "conversations_agent_profile_update": lambda w: {"agent_profile": w.values["profile"]},
    "conversations_import_create": _transcript,
    "documents_create": _document,
    "knowledge_search_create": lambda w: {"query": "runbook"},
    "users_memories_create": lambda w: {"content": "Likes tea"},
    "users_memory_blocks_update": lambda w: {"value": "updated"},
    "users_memory_blocks_partial_update": lambda w: {"append": " more"},
    "images_pin_create": lambda w: {"pinned": True},
}
QUERIES: dict[str, dict[str, str]] = {"users_memories_search_retrieve": {"q": "PostgreSQL"}}
# A block the outsider has is changed with the version it read (the world's blocks are at version 1).
HEADERS: dict[str, dict[str, str]] = {
    "users_memory_blocks_update": {"If-Match": "1"},
    "users_memory_blocks_partial_update": {"If-Match": "1"},
}


def _without(name: str) -> Callable[[dict[str, Any]], None]:
    return lambda body: body.pop(name, None)


# Changes to the body when a reference is set: fields that exclude each other.
WHEN_SET: dict[tuple[str, str], Callable[[dict[str, Any]], None]] = {
    ("conversations_context_create", "user_message_id"): _without("user_message"),
}
# Operations whose ndjson body is built by the sweep: the transcript's parts name images.
NDJSON_REFS = {"conversations_import_create": [Ref("body", "parts[].image_id", "image")]}


def _ndjson_with(value: str) -> bytes:
    line = {"uuid": "a", "parentUuid": None, "role": "user", "content": "look", "parts": sweep_parts(value)}
    return json.dumps(line).encode()


@dataclass
class Call:
    op: Operation
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


def _set(body: dict[str, Any], ref: Ref, value: str) -> None:
    """Puts `value` at the ref's path in the body, making the objects and lists on the way."""
    target: Any = body
    for step, following in zip(ref.path, ref.path[1:], strict=False):
        empty: Any = [] if isinstance(following, int) else {}
        if isinstance(step, int):
            while len(target) <= step:
                target.append(empty)
            target = target[step]
        else:
            target = target.setdefault(step, empty)
    target[ref.path[-1]] = ref.wrap(value) if ref.wrap else value


def call_for(
    op: Operation, own: World, chosen: dict[Ref, str] | None = None, *, form: str | None = None
) -> Call:
    """The operation on the outsider's own objects, with the chosen value in each place a ref names."""
    chosen = chosen or {}
    by_place = {(ref.where, ref.name): value for ref, value in chosen.items()}
    path = op.path
    for name in op.path_params:
        kind = sweep.kind_of(name, always=True) or ""
        path = path.replace(f"{{{name}}}", str(by_place.get(("path", name), own.values[kind])))
    query = dict(QUERIES.get(op.operation_id, {}))
    headers = dict(HEADERS.get(op.operation_id, {}))
    body = BODIES[op.operation_id](own) if op.operation_id in BODIES else _minimal(op)
    for ref, value in chosen.items():
        if ref.where == "query":
            query[ref.name] = value
        elif ref.where == "header":
            headers[ref.name] = value
        elif ref.where == "body" and op.content_type == "application/x-ndjson":
            body = _ndjson_with(value)
        elif ref.where == "body":
            WHEN_SET.get((op.operation_id, ref.name), lambda b: None)(body)
            _set(body, ref, value)
    if form is not None:  # the JSON body, as the one field of a multipart form
        body = {form: json.dumps(body)}
    return Call(op=op, path=path, query=query, headers=headers, body=body)


def _minimal(op: Operation) -> dict[str, Any] | None:
    """No body, or an empty one (an operation whose body has required fields has one in BODIES)."""
    return None if op.body_schema is None else {}


def send(call: Call, actor: Actor) -> tuple[Any, bytes]:
    """The request, in a savepoint rolled back after it: every request meets the same two worlds."""
    from urllib.parse import urlencode

    url = call.path + ("?" + urlencode(call.query) if call.query else "")
    extra = {"HTTP_" + k.upper().replace("-", "_"): v for k, v in call.headers.items()}
    method = getattr(actor.client, call.op.method.lower())
    with transaction.atomic():
        if call.body is None:
            response = method(url, **extra)
        elif call.op.content_type == "application/x-ndjson":
            response = method(url, data=call.body, content_type=call.op.content_type, **extra)
        elif call.op.content_type == "multipart/form-data":
            response = method(url, call.body, format="multipart", **extra)
        else:
            response = method(url, call.body, format="json", **extra)
        body = sweep.body_bytes(response)
        transaction.set_rollback(True)
    return response, body


# --- the sweep ---------------------------------------------------------------------------------------------

# What another tenant's id gets, by where it is named (a name kind has no set answer: only "as a stranger's").
# A query parameter filters the caller's own list: naming nothing of the caller's, it lists nothing (200),
# and the comparison with a random id holds the page to the same shape, an empty one.
EXPECTED = {"path": {404}, "body": {400, 404}, "query": {200, 400, 404}, "header": {400, 404}}


@dataclass
class Sweep:
    schema: dict[str, Any]
    owner: World
    own: World
    markers: set[str]
    operations: int = 0
    requests: int = 0
    failures: list[str] = field(default_factory=list)

    def call(self, op: Operation, chosen: dict[Ref, str] | None = None) -> tuple[Any, bytes]:
        """The operation as the outsider, on its own objects but for the chosen values."""
        self.requests += 1
        form = sweep.form_field(self.schema, op)
        return send(call_for(op, self.own, chosen, form=form), self.own.actor)

    def fail(self, op: Operation, message: str) -> None:
        self.failures.append(f"{op.method} {op.path} ({op.operation_id}, {op.content_type}): {message}")


def probe_operation(run: Sweep, op: Operation) -> None:
    run.operations += 1
    try:
        refs = sweep.refs(run.schema, op) + NDJSON_REFS.get(op.operation_id, [])
    except sweep.Unknown as exc:
        run.fail(op, f"cannot drive it: {exc} (tests/security/sweep.py)")
        return
    response, body = run.call(op)
    if response.status_code >= 400:
        run.fail(
            op, f"cannot drive it: {response.status_code} with the outsider's own objects: {body[:200]!r}"
        )
        return
    found = sweep.leaks(response, body, run.markers)
    if found:
        run.fail(op, f"the owner's {found} in the answer to a request naming nothing of the owner's")
    for ref in refs:
        if ref.where != "path" and ref.kind in ID_KINDS and not own_accepted(run, op, ref):
            continue
        probe(run, op, [ref])
    in_path = [ref for ref in refs if ref.where == "path"]
    if len(in_path) > 1:
        probe(run, op, in_path)  # every path parameter the owner's at once


def own_accepted(run: Sweep, op: Operation, ref: Ref) -> bool:
    """The outsider's own object in the place must be accepted: then a refusal of the owner's comes from
    whose object it is, not from the request."""
    response, body = run.call(op, {ref: run.own.values[ref.kind]})
    if response.status_code >= 400:
        where = f"{ref.where} {ref.name}"
        run.fail(op, f"cannot drive it: its own {ref.kind} in {where}: {response.status_code} {body[:200]!r}")
    return response.status_code < 400


def probe(run: Sweep, op: Operation, refs: list[Ref]) -> None:
    """The owner's objects in these places against random ones: answered alike, and as EXPECTED for ids."""
    where = ", ".join(f"{ref.where} {ref.name}" for ref in refs)
    real = {ref: run.owner.values[ref.kind] for ref in refs}
    fake = {ref: sweep.random_value(ref.kind) for ref in refs}
    answers = []
    for chosen in (real, fake):
        sent = list(chosen.values())
        response, body = run.call(op, chosen)
        if response.status_code >= 500:
            run.fail(op, f"{where}: {response.status_code} for {sent}")
        answers.append(sweep.answer(response, body, sent))
        found = sweep.leaks(response, body, run.markers, sent=sent)
        if chosen is real and found:
            run.fail(op, f"{where}: the owner's {found} in the answer")
    expected = EXPECTED[refs[0].where] if all(ref.kind in ID_KINDS for ref in refs) else None
    if expected is not None and answers[0][0] not in expected:
        run.fail(op, f"{where}: the owner's object answered {answers[0][0]}, not {sorted(expected)}")
    if answers[0] != answers[1]:
        run.fail(op, f"{where}: the owner's object and a random one differ: {answers[0]} / {answers[1]}")


def test_every_operation_answers_the_outsider_as_a_stranger(worlds, capsys):
    owner, own = worlds
    schema = SchemaGenerator().get_schema(request=None, public=True)
    run = Sweep(schema=schema, owner=owner, own=own, markers=owner_markers(owner))
    ops = sweep.operations(schema)
    for op in ops:
        probe_operation(run, op)
    named = len({op.operation_id for op in ops})
    with capsys.disabled():
        print(f"\noutsider sweep: {named} operations ({run.operations} with each body type), ", end="")
        print(f"{run.requests} requests")
    assert run.failures == [], "\n".join(run.failures)
    assert run.operations == len(ops) > 40


# --- the sweep grows with the API --------------------------------------------------------------------------


def _operation(path: str, body: dict[str, Any] | None = None) -> Operation:
    params = tuple(re.findall(r"{(\w+)}", path))
    return Operation("POST", path, "op", params, (), (), "application/json" if body else None, body)


def test_an_operation_naming_what_the_sweep_does_not_know_fails_it_until_taught():
    schema: dict[str, Any] = {"paths": {}, "components": {"schemas": {}}}
    with pytest.raises(sweep.Unknown, match="widget_id"):
        sweep.refs(schema, _operation("/api/v1/widgets/{widget_id}"))
    body = {"type": "object", "properties": {"gadget_id": {"type": "string"}}}
    with pytest.raises(sweep.Unknown, match="gadget_id"):
        sweep.refs(schema, _operation("/api/v1/things", body))


def test_a_new_body_field_naming_a_known_kind_is_swept_without_teaching():
    schema: dict[str, Any] = {"paths": {}, "components": {"schemas": {}}}
    body = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},  # a speaker's name: free text
            "document_ids": {"type": "array", "items": {"type": "string", "format": "uuid"}},
            "options": {"type": "object", "properties": {"turn_id": {"type": "string", "format": "uuid"}}},
        },
    }
    found = sweep.refs(schema, _operation("/api/v1/conversations/{conversation_id}/things", body))
    assert [(r.where, r.name, r.kind) for r in found] == [
        ("path", "conversation_id", "conversation"),
        ("body", "document_ids", "document"),
        ("body", "options.turn_id", "turn"),
    ]
