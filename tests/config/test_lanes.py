"""Through Django's middleware: an API request steps aside while a context call runs in the process, within
MNEMO_BACKGROUND_YIELD_MS, and never inside a transaction; a context call never waits for another."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction

from config.lanes import _statement_steps_aside
from providers import lanes
from providers.metrics import BACKGROUND_YIELD_SECONDS
from tests.context.helpers import context_call

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_request_answers_only_once_the_foreground_call_has_ended(owner, conversation, held, settings):
    settings.MNEMO_BACKGROUND_YIELD_MS = 30_000
    threading.Timer(0.3, held.set).start()

    response = owner.client.get(f"/api/v1/conversations/{conversation.id}/messages")

    assert response.status_code == 200
    assert held.is_set()  # it stepped aside until then


def test_its_budget_bounds_the_wait(owner, conversation, held, settings):
    settings.MNEMO_BACKGROUND_YIELD_MS = 100
    before = BACKGROUND_YIELD_SECONDS._value.get()

    response = owner.client.get(f"/api/v1/conversations/{conversation.id}/messages")

    assert response.status_code == 200
    assert 0.09 <= BACKGROUND_YIELD_SECONDS._value.get() - before < 5  # it waited, then went on
    assert not held.is_set()  # the foreground call still runs


def test_zero_turns_the_lanes_off(owner, conversation, held, settings):
    settings.MNEMO_BACKGROUND_YIELD_MS = 0
    before = BACKGROUND_YIELD_SECONDS._value.get()

    response = owner.client.get(f"/api/v1/conversations/{conversation.id}/messages")

    assert response.status_code == 200
    assert BACKGROUND_YIELD_SECONDS._value.get() == before


def test_a_context_call_does_not_wait_for_another(owner, conversation, held, settings):
    settings.MNEMO_BACKGROUND_YIELD_MS = 30_000
    before = BACKGROUND_YIELD_SECONDS._value.get()

    response = context_call(owner, conversation, user_message="What did we decide?")

    assert response.status_code == 200, response.content
    assert BACKGROUND_YIELD_SECONDS._value.get() == before  # it never stepped aside


def test_statements_inside_a_transaction_do_not_step_aside(held):
    before = BACKGROUND_YIELD_SECONDS._value.get()
    with transaction.atomic(), background_cursor() as cursor:
        cursor.execute("SELECT 1")
    assert BACKGROUND_YIELD_SECONDS._value.get() == before
    assert not held.is_set()

    threading.Timer(0.3, held.set).start()
    with background_cursor() as cursor:
        cursor.execute("SELECT 1")  # outside one: it waits for the foreground call
    assert held.is_set()


@contextmanager
def background_cursor() -> Iterator[Any]:
    """A cursor of a request in the background lane, as config.lanes.LaneMiddleware sets one up."""
    with (
        lanes.background(30.0),
        connection.execute_wrapper(_statement_steps_aside),
        connection.cursor() as cursor,
    ):
        yield cursor


def test_context_calls_have_threads_of_their_own():
    """Every other thread is held by a request (one that stepped aside, say): a context call still runs."""
    import asyncio

    import httpx

    from config.asgi import ThreadedHttp

    busy = threading.Event()

    def wsgi(environ, start_response):
        if not environ["PATH_INFO"].endswith("/context"):
            busy.wait(10)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [environ["PATH_INFO"].encode()]

    async def calls() -> str:
        transport = httpx.ASGITransport(app=ThreadedHttp(wsgi, 1, 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            held = asyncio.ensure_future(client.post("/api/v1/conversations/c1/messages"))
            await asyncio.sleep(0.1)  # the only background thread is taken
            answered = await asyncio.wait_for(client.post("/api/v1/conversations/c1/context"), 5)
            assert not held.done()
            busy.set()
            await held
            return answered.text

    try:
        assert asyncio.run(calls()) == "/api/v1/conversations/c1/context"
    finally:
        busy.set()
