"""On PostgreSQL a plain append is one statement (conversations/services/one_statement.py): it must write
what the locked path writes, fall back to it for replays and races, and attach the turn that is active once
it holds the conversation's row lock."""

import threading
import time
from datetime import UTC, datetime

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from conversations.models import Conversation, Message
from conversations.services import append as append_path
from conversations.services import message_append_batch, turn_end, turn_start
from conversations.signals import exchange_completed
from tenants.errors import ApplicationError

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the one-statement append is PostgreSQL's (set DATABASE_URL)"
)


def _append(conversation, key=None, **item):
    item = {"role": "user", "content": "hello", **item}
    return message_append_batch(conversation=conversation, items=[item], idempotency_key=key)


def _row(message: Message) -> dict:
    skip = {"id", "seq", "created_at", "idempotency_key"}
    return {
        f.attname: getattr(message, f.attname) for f in Message._meta.concrete_fields if f.attname not in skip
    }


@pytest.mark.django_db(transaction=True)
def test_a_plain_append_outside_a_transaction_is_one_statement(conversation):
    with CaptureQueriesContext(connection) as queries:
        [result] = _append(conversation, key="k1", content="one round trip")
    assert len(queries.captured_queries) == 1
    assert queries.captured_queries[0]["sql"].startswith("WITH reserved AS (UPDATE")
    stored = Message.objects.get(pk=result.message.pk)
    assert result.created and stored.seq == result.message.seq == 1
    assert Conversation.objects.get(pk=conversation.pk).last_seq == 1


@pytest.mark.django_db
def test_it_writes_what_the_locked_path_writes(conversation, monkeypatch):
    item = {
        "role": "assistant",
        "content": "Ça marche — 中文 too",
        "parts": [{"type": "text", "text": "Ça marche — 中文 too"}],
        "metadata": {"source": "sdk", "n": [1, 2]},
        "completed": False,
        "is_error": True,
    }
    turn = turn_start(conversation=conversation)
    [fast] = _append(conversation, key="fast", **item)
    monkeypatch.setattr(append_path, "fits_one_statement", lambda row: False)
    [slow] = _append(conversation, key="slow", **item)

    fast_row, slow_row = (Message.objects.get(pk=r.message.pk) for r in (fast, slow))
    assert _row(fast_row) == _row(slow_row)
    assert fast_row.turn_id == turn.id
    assert (fast_row.seq, slow_row.seq) == (1, 2)
    assert _row(fast.message) == _row(fast_row)  # the returned object is what was stored
    assert fast.message.created_at == fast_row.created_at


@pytest.mark.django_db(transaction=True)
def test_the_clients_created_at_rides_in_the_same_one_statement(conversation, monkeypatch):
    dated = datetime(2024, 3, 15, 8, 30, tzinfo=UTC)
    before = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        [fast] = _append(conversation, key="fast", created_at=dated)
    assert len(queries.captured_queries) == 1
    monkeypatch.setattr(append_path, "fits_one_statement", lambda row: False)
    [slow] = _append(conversation, key="slow", created_at=dated)

    stored = [Message.objects.get(pk=r.message.pk) for r in (fast, slow)]
    assert [m.created_at for m in stored] == [dated, dated]
    assert fast.message.created_at == dated
    # The conversation changed now, not at the message's date.
    assert Conversation.objects.get(pk=conversation.pk).updated_at >= before


@pytest.mark.django_db
def test_a_replay_takes_the_locked_path_and_answers_the_original(conversation):
    [first] = _append(conversation, key="same")
    [again] = _append(conversation, key="same")
    assert (first.created, again.created) == (True, False)
    assert again.message.pk == first.message.pk
    assert Conversation.objects.get(pk=conversation.pk).last_seq == 1  # no seq spent on the replay
    with pytest.raises(ApplicationError) as refused:
        _append(conversation, key="same", content="something else")
    assert refused.value.code == "idempotency_conflict"
    assert Message.objects.filter(conversation=conversation).count() == 1


@pytest.mark.django_db
def test_the_active_turn_is_attached_and_an_ended_one_is_not(conversation):
    turn = turn_start(conversation=conversation)
    [inside] = _append(conversation)
    turn_end(turn=turn)
    [after] = _append(conversation)
    assert inside.message.turn_id == turn.id
    assert after.message.turn_id is None
    assert Message.objects.get(pk=after.message.pk).turn_id is None


@pytest.mark.django_db(transaction=True)
def test_a_turn_started_by_a_writer_it_waited_for_is_seen(conversation):
    """The appending statement waits on the row lock while another transaction starts a turn; once that
    commits, the message belongs to the new turn (a subquery of the statement would still see none)."""
    locked = threading.Event()
    started: list = []

    def start_turn_slowly() -> None:
        try:
            with transaction.atomic():
                Conversation.objects.select_for_update().get(pk=conversation.pk)
                started.append(turn_start(conversation=conversation))
                locked.set()
                time.sleep(0.5)  # the append below is waiting on the lock meanwhile
        finally:
            connections.close_all()

    other = threading.Thread(target=start_turn_slowly)
    other.start()
    assert locked.wait(5)
    began = time.monotonic()
    [result] = _append(conversation, key="waited")
    waited = time.monotonic() - began
    other.join()
    assert waited > 0.2, "the append did not wait for the lock: the test proves nothing"
    assert result.message.turn_id == started[0].id
    assert Message.objects.get(pk=result.message.pk).turn_id == started[0].id


@pytest.mark.django_db(transaction=True)
def test_two_writers_with_one_key_at_once_store_one_message(conversation):
    barrier = threading.Barrier(2)
    results: list = []

    def write() -> None:
        try:
            barrier.wait()
            results.append(_append(conversation, key="raced", content="same")[0])
        finally:
            connections.close_all()

    for _ in range(20):  # a race needs a few tries to happen both ways
        results.clear()
        threads = [threading.Thread(target=write) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len({r.message.pk for r in results}) == 1
        assert sorted(r.created for r in results) == [False, True]
        assert Message.objects.filter(conversation=conversation).count() == 1
        Message.objects.filter(conversation=conversation).delete()
        Conversation.objects.filter(pk=conversation.pk).update(last_seq=0)


@pytest.mark.django_db(transaction=True)
def test_a_failing_receiver_after_the_commit_is_logged_not_raised(conversation, caplog):
    """Outside a transaction the statement has committed before exchange_completed is sent: a receiver that
    fails (say the cache is down) must not turn the stored append into an error a client would retry."""

    def broken(**kwargs):
        raise ConnectionError("cache down")

    exchange_completed.connect(broken, weak=False)
    try:
        [result] = _append(conversation, role="assistant", content="stored anyway")
    finally:
        exchange_completed.disconnect(broken)
    assert Message.objects.get(pk=result.message.pk).content == "stored anyway"
    assert "exchange_completed receiver" in caplog.text and "cache down" in caplog.text
