"""Tenant isolation for every operation of the OpenAPI schema, the conversation socket and both chat-proxy
shapes: the owner builds one of each object; the outsider, with its own key and its own objects of each kind,
calls every operation with the owner's id (or name) in each place the operation names an object.

Every such request must be answered as the same request naming nothing (a random id): the same status, the
same headers, the same error; a 404 for an id in the path, a 400 or 404 for one in a body; and nothing of the
owner's (its marker text, its ids, its key) in the body or headers. Each request also runs with the
outsider's own object in that place and must succeed, which proves the refusal came from the reference.
Every request runs in a savepoint that is rolled back, so each one meets the same two worlds.

An operation the sweep cannot drive (a parameter or field it cannot classify, a body it cannot build, a
request that fails with the outsider's own objects) fails the sweep until it is taught here or in
tests/security/sweep.py."""

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

from tests.cold_storage.helpers import frame, image_part
from tests.conftest import Actor
from tests.llm_server import llm_server  # noqa: F401
from tests.security import sweep
from tests.security.sweep import ID_KINDS, Operation, Ref
from tests.security.sweep import image_parts as sweep_parts

pytestmark = pytest.mark.django_db

OWNER_MARK = "Zanzibar7431"  # in every text the owner writes; never in an answer to the outsider
OUTSIDER_MARK = "Quokka2208"


@dataclass
class World:
    """One tenant's objects, by kind: ids, and names of its own (end user, block label, client keys)."""

    actor: Actor
    mark: str
    values: dict[str, str] = field(default_factory=dict)


def _ok(response: Any) -> Any:
    assert response.status_code < 300, response.content[:400]
    return response.json()


def world_build(actor: Actor, *, mark: str, user: str, seed: int) -> World:
    """Through the API, as the client app would: a conversation with a turn, messages (one with an image),
    a context call, a task-state event, a memory block, an archival memory, an agent profile, a document."""
    client, world = actor.client, World(actor=actor, mark=mark)

    def post(path: str, body: Any = None, **extra: Any) -> Any:
        return _ok(client.post(f"/api/v1/{path}", body, format="json", **extra))

    conversation = post("conversations", {"end_user": user, "title": f"{mark} release plan"})["id"]
    base = f"conversations/{conversation}"
    turn = post(f"{base}/turns")["id"]
    key, request_id = f"{mark}-key", f"{mark}-request"
    first = {"role": "user", "content": f"{mark}: ship the billing fix on Tuesday", "idempotency_key": key}
    post(f"{base}/messages", {"messages": [first, {"role": "assistant", "content": f"Noted, {mark}."}]})
    shot = [{"type": "text", "text": f"{mark} screen"}, image_part(frame(seed))]
    # Not completed: the one message whose parts may still change (PATCH names images too).
    message = post(f"{base}/messages", {"role": "user", "parts": shot, "completed": False})
    image = next(p["image_id"] for p in message["parts"] if p["type"] == "image")
    context = post(f"{base}/context", {"user_message": f"When does {mark} ship?"})["context_id"]
    event = {"expected_epoch": 0, "request_id": request_id, "event_type": "set", "payload": {"path": "plan"}}
    post(f"{base}/state/events", event | {"payload": {"path": "plan", "value": mark}})
    label = f"{mark.lower()}-notes"
    _ok(client.put(f"/api/v1/users/{user}/memory/blocks/{label}", {"value": f"{mark} notes"}, format="json"))
    memory = post(f"users/{user}/memories", {"content": f"{mark} prefers PostgreSQL"})["memory"]["id"]
    profile = post("agent-profiles", {"name": f"{mark} agent", "policy": f"{mark} policy"})["id"]
    upload = SimpleUploadedFile("notes.md", f"# {mark}\n\nThe {mark} runbook.".encode(), "text/markdown")
    document = _ok(client.post("/api/v1/documents", {"file": [upload], "conversation": conversation}))
    world.values = {
        "conversation": conversation,
        "turn": turn,
        "message": message["id"],
        "image": image,
        "context": context,
        "memory": memory,
        "profile": profile,
        "document": document["documents"][0]["id"],
        "user": user,
        "label": label,
        "idempotency": key,
        "request": request_id,
        "target": memory,
        "source": message["id"],
    }
    return world


@pytest.fixture
def worlds(owner, outsider) -> tuple[World, World]:
    return (
        world_build(owner, mark=OWNER_MARK, user="alice", seed=1),
        world_build(outsider, mark=OUTSIDER_MARK, user="mallory", seed=2),
    )


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


def owner_markers(owner: World) -> set[str]:
    """What must never reach the outsider: the owner's text, ids, tenant and key."""
    tenant = owner.actor.tenant
    ids = {v for k, v in owner.values.items() if k in ID_KINDS}
    return {owner.mark, str(tenant.pk), tenant.slug, owner.actor.raw_key, owner.actor.api_key.prefix, *ids}


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


# --- the conversation socket -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_socket_answers_the_outsider_as_a_stranger_and_tells_it_nothing(owner, outsider):
    """The outsider's socket on the owner's conversation closes as on a random id, whichever way the key
    comes; its socket on its own conversation hears nothing of the owner's messages."""
    from channels.layers import channel_layers

    from conversations.services import conversation_create
    from tests.conversations.test_websocket import QUIET, append, next_event, open_socket, refusal_code, run

    owners = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title=OWNER_MARK)
    own = conversation_create(tenant=outsider.tenant, end_user_external_id="mallory")
    key = outsider.raw_key
    credentials = [
        {"key": key},
        {"query": f"?api_key={key}"},
        {"subprotocols": ["mnemo", f"mnemo.bearer.{key}"]},
    ]

    async def scenario():
        for given in credentials:
            codes = [await refusal_code(target, **given) for target in (owners.id, uuid.uuid4())]
            assert codes[0] == codes[1] == 4404, given
        async with open_socket(own.id, key=key) as mine, open_socket(owners.id, key=owner.raw_key) as theirs:
            await append(owner, owners, f"{OWNER_MARK} secret plan")
            assert OWNER_MARK in json.dumps(await next_event(theirs))  # the event was sent, to its tenant
            assert await mine.receive_nothing(QUIET)

    channel_layers.backends.clear()  # a layer belongs to the event loop that made it
    try:
        run(scenario)
    finally:
        channel_layers.backends.clear()


# --- the chat proxy, both shapes ---------------------------------------------------------------------------


def _proxy_body(fmt: str, **extra: Any) -> dict[str, Any]:
    question = {"role": "user", "content": "What do you know about me?"}
    if fmt == "anthropic":
        return {"model": "claude-3-5-sonnet", "max_tokens": 64, "messages": [question], **extra}
    return {"model": "gpt-4o", "messages": [question], **extra}


PROXY_URLS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
# Where a proxy request names an object: the conversation header (an id), and the end user (a name: the
# header, OpenAI's `user`, Anthropic's `metadata.user_id`), as (kind, headers, body fields) for a value.
PROXY_REFS: list[tuple[str, str, Callable[[str, str], tuple[dict[str, str], dict[str, Any]]]]] = [
    ("conversation", "X-Mnemo-Conversation", lambda fmt, v: ({"HTTP_X_MNEMO_CONVERSATION": v}, {})),
    ("user", "X-Mnemo-User", lambda fmt, v: ({"HTTP_X_MNEMO_USER": v}, {})),
    (
        "user",
        "user / metadata.user_id",
        lambda fmt, v: ({}, {"metadata": {"user_id": v}} if fmt == "anthropic" else {"user": v}),
    ),
]


@pytest.fixture
def proxy_upstream(settings, llm_server):  # noqa: F811
    """Both upstream formats answered by the test server (tests/llm_server.py)."""
    from context.proxy import upstream

    settings.LLM_BASE_URL, settings.LLM_API_KEY = llm_server.base_url, "sk-upstream"
    settings.ANTHROPIC_BASE_URL = llm_server.base_url.removesuffix("/v1")
    settings.ANTHROPIC_API_KEY = "sk-upstream"
    upstream._http_client.cache_clear()
    upstream._openai_clients.clear()
    yield llm_server
    upstream._http_client.cache_clear()
    upstream._openai_clients.clear()


def proxy_send(actor: Actor, fmt: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[Any, bytes]:
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Bearer {actor.raw_key}", **headers)
    with transaction.atomic():
        response = client.post(PROXY_URLS[fmt], json.dumps(body), content_type="application/json")
        body_bytes = sweep.body_bytes(response)
        transaction.set_rollback(True)
    return response, body_bytes


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_the_proxy_answers_the_outsider_as_a_stranger(worlds, proxy_upstream, fmt):
    """The owner's conversation in the header is a 404 as a random id is; the owner's end user's name is the
    outsider's own end user of that name: nothing of the owner's reaches the answer or the upstream."""
    owner, own = worlds
    markers = owner_markers(owner)
    # The control: the owner's own request for its end user carries that user's memory upstream, so the
    # checks below would see it reach the outsider's.
    proxy_send(owner.actor, fmt, {"HTTP_X_MNEMO_USER": owner.values["user"]}, _proxy_body(fmt))
    assert OWNER_MARK in json.dumps(proxy_upstream.requests)
    for kind, where, place in PROXY_REFS:
        answers = []
        for value in (owner.values[kind], sweep.random_value(kind)):
            headers, extra = place(fmt, value)
            before = len(proxy_upstream.requests)
            response, body = proxy_send(own.actor, fmt, headers, _proxy_body(fmt, **extra))
            assert response.status_code == (404 if kind in ID_KINDS else 200), (where, body[:300])
            assert sweep.leaks(response, body, markers, sent=[value]) == [], where
            sent_upstream = json.dumps(proxy_upstream.requests[before:])
            assert not [m for m in markers if m in sent_upstream], (where, "upstream")
            answers.append(sweep.answer(response, body, [value]))
        assert answers[0] == answers[1], where
    models = own.actor.client.get("/v1/models")
    assert models.status_code == 200 and sweep.leaks(models, models.content, markers) == []


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
