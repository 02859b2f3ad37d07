"""The conversation socket and both chat-proxy shapes held to what tests/security/test_outsider_sweep.py
holds every REST operation to: the owner's conversation (or end user's name) in the outsider's request is
answered as a random one, and nothing of the owner's reaches the outsider, nor the upstream model on the
outsider's behalf."""

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from tests.conftest import Actor
from tests.llm_server import llm_server  # noqa: F401
from tests.security import sweep
from tests.security.sweep import ID_KINDS
from tests.security.worlds import OWNER_MARK, owner_markers

pytestmark = pytest.mark.django_db


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
