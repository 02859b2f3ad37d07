"""Reads beside a request (tenants.statements.beside): on PostgreSQL outside a transaction each runs on a
thread of its own with a connection of its own, in the caller's context, its error raised where its result is
asked for; inside a transaction (whose rows another connection could not see) and on SQLite it runs in the
caller, at once. A context call's retrieval gives the same candidates either way."""

import threading
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar

import pytest
from django.db import connection

from context.pipeline import context_assemble
from context.state import ContextRequest
from conversations.services import conversation_create
from memory.models import ArchivalMemory
from retrieval import find
from tenants import statements
from tenants.statements import beside
from tests.summaries.helpers import append

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="reads beside are PostgreSQL's"
)
asked: ContextVar[str] = ContextVar("asked", default="")
FILLER = [
    "Thanks, that helps. Let us keep going with the plan as discussed.",
    "Sure, I looked through the recent output and nothing stands out.",
]


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


@postgresql_only
@pytest.mark.django_db(transaction=True)  # autocommit, as a request runs
def test_a_read_runs_on_a_thread_and_connection_of_its_own_in_the_callers_context():
    asked.set("tenant-a")
    started = threading.Event()

    def where() -> tuple[str, int, str]:
        started.set()
        return threading.current_thread().name, backend_pid(), asked.get()

    read = beside(where)
    assert started.wait(10)  # taken by a thread (asked for before, it would have run here)
    name, pid, seen = read()
    assert name.startswith("mnemo-beside") and seen == "tenant-a"
    assert pid != backend_pid()


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_its_error_is_raised_where_its_result_is_asked_for():
    read = beside(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        read()


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_read_no_thread_has_taken_yet_runs_in_the_caller(monkeypatch):
    pool, release = ThreadPoolExecutor(max_workers=1), threading.Event()
    monkeypatch.setattr(statements, "_beside", pool)
    pool.submit(release.wait, 10)  # the only thread is busy
    try:
        read = beside(lambda: threading.current_thread().name)
        assert read() == threading.current_thread().name
    finally:
        release.set()
        pool.shutdown()


@pytest.mark.django_db
def test_inside_a_transaction_or_on_sqlite_a_read_runs_here_and_now(conversation):
    append(conversation, {"role": "user", "content": "Not committed yet."})  # the test's transaction
    ran = []
    read = beside(lambda: ran.append(threading.current_thread().name) or conversation.messages.count())
    assert ran == [threading.current_thread().name]  # before the result was asked for
    assert read() == 1


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_context_calls_candidates_are_the_same_found_beside_or_in_turn(owner, settings, monkeypatch):
    settings.MNEMO_EMBEDDINGS = "none"
    earlier = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Last week")
    said = ["The rollback vault entry is zebra-quartz-42.", "Noted."]
    append(
        earlier,
        *[
            {"role": ("user", "assistant")[i % 2], "content": text}
            for i, text in enumerate(FILLER + said + FILLER)
        ],
    )
    conversation = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Now")
    append(
        conversation,
        *[{"role": ("user", "assistant")[i % 2], "content": text} for i, text in enumerate(FILLER)],
    )
    ArchivalMemory.objects.create(
        tenant=owner.tenant, end_user=conversation.end_user, content="Alice's rollback vault is in Oslo."
    )
    request = ContextRequest(
        user_message="Which rollback vault entry did we pick?", token_budget=4000, record=False
    )

    def candidates() -> tuple:
        state = context_assemble(conversation=conversation, request=request)
        return tuple(item.text for item in state.candidates), [d.code for d in state.degradations]

    found_beside = candidates()
    monkeypatch.setattr(find, "beside", lambda read: (lambda value: lambda: value)(read()))
    assert candidates() == found_beside
    assert len(found_beside[0]) >= 2  # the other conversation's message and the memory
