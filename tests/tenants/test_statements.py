"""FixedQuery runs a queryset compiled once with other values: it must give what the ORM gives for the same
values (converted the same way), and refuse what it cannot compile faithfully."""

import tempfile
import uuid

import pytest
from django.db import DataError, IntegrityError, connection, transaction
from django.db.models import F
from django.db.models.expressions import RawSQL
from psycopg import pq

from conversations.models import Message
from prefix_cache.models import CacheUsage, PrefixHint
from prefix_cache.services import PrefixLevel, PrefixMatch, prefix_hints_record
from summaries.models import SummarySegment
from tenants.statements import (
    FixedQuery,
    column_by_pk,
    list_samples,
    list_values,
    read_ahead,
    writes_pipelined,
)
from tests.factories import ConversationFactory, MessageFactory

pytestmark = pytest.mark.django_db


def _messages(conversation_id, after):
    return (
        Message.objects.filter(conversation_id=conversation_id, seq__gt=after)
        .order_by("-seq")
        .values_list("id", "seq", "parts", "completed", "created_at")
    )


ROWS = FixedQuery(_messages, conversation_id=uuid.uuid4(), after=7_123_456_789_001)


def test_rows_are_the_orms_for_each_set_of_values(django_assert_num_queries):
    first, second = ConversationFactory(), ConversationFactory()
    for seq in (1, 2, 3):
        MessageFactory(conversation=first, seq=seq, parts=[{"type": "text", "text": f"p{seq}"}])
    MessageFactory(conversation=second, seq=1, completed=False)

    for conversation, after in ((first, 0), (first, 2), (second, 0), (second, 5)):
        with django_assert_num_queries(1):
            got = ROWS.run(conversation_id=str(conversation.pk), after=after)
        assert got == list(_messages(conversation.pk, after))
    assert ROWS.run(conversation_id=first.pk, after=1)[0][2] == [{"type": "text", "text": "p3"}]


def test_flat_values_and_model_rows():
    conversation = ConversationFactory()
    MessageFactory(conversation=conversation, seq=4)
    seqs = FixedQuery(
        lambda conversation_id: Message.objects.filter(conversation_id=conversation_id).values_list(
            "seq", flat=True
        ),
        conversation_id=uuid.uuid4(),
    )
    assert seqs.run(conversation_id=conversation) == [4]
    rows = FixedQuery(
        lambda conversation_id: Message.objects.filter(conversation_id=conversation_id).order_by("seq"),
        conversation_id=uuid.uuid4(),
    )
    (message,) = rows.run(conversation_id=conversation.pk)
    expected = Message.objects.get(conversation=conversation)
    fields = [f.attname for f in Message._meta.concrete_fields]
    assert [getattr(message, f) for f in fields] == [getattr(expected, f) for f in fields]
    assert message._state.adding is False and message._state.db == "default"
    assert rows.first(conversation_id=uuid.uuid4()) is None


def test_model_rows_carry_their_annotations_and_an_in_list_has_fixed_places(django_assert_num_queries):
    conversation = ConversationFactory(title="Deploys")
    messages = [MessageFactory(conversation=conversation, seq=seq) for seq in (1, 2, 3)]
    by_seqs = FixedQuery(
        lambda **seqs: (
            Message.objects.filter(seq__in=list(seqs.values()))
            .order_by("seq")
            .annotate(title=F("conversation__title"))
        ),
        **list_samples("seq", 4, 7_123_456_789_301),
    )
    for asked in ([3, 1], [2], []):
        with django_assert_num_queries(1):
            rows = by_seqs.run(**list_values("seq", asked, 4, -1))
        assert [m.pk for m in rows] == [m.pk for m in messages if m.seq in asked]
        assert all(m.title == "Deploys" and m.conversation_id == conversation.pk for m in rows)
    with pytest.raises(ValueError, match="5 values for 4 places"):
        list_values("seq", [1, 2, 3, 4, 5], 4, -1)


def test_a_sample_the_sql_does_not_carry_fails_loudly():
    # seq >= -1 is always true for the column's range, so Django leaves the condition out of the SQL.
    query = FixedQuery(
        lambda conversation_id, after: Message.objects.filter(
            conversation_id=conversation_id, seq__gte=after
        ).values_list("seq"),
        conversation_id=uuid.uuid4(),
        after=-1,
    )
    with pytest.raises(ValueError, match="'after'"):
        query.run(conversation_id=uuid.uuid4(), after=0)


def test_none_and_unsupported_shapes_are_refused():
    with pytest.raises(TypeError):
        ROWS.run(conversation_id=None, after=0)
    related = FixedQuery(
        lambda conversation_id: SummarySegment.objects.filter(conversation_id=conversation_id).select_related(
            "conversation"
        ),
        conversation_id=uuid.uuid4(),
    )
    with pytest.raises(ValueError, match="select_related"):
        related.run(conversation_id=uuid.uuid4())
    values = FixedQuery(
        lambda conversation_id: Message.objects.filter(conversation_id=conversation_id).values("seq"),
        conversation_id=uuid.uuid4(),
    )
    with pytest.raises(ValueError, match="not supported"):
        values.run(conversation_id=uuid.uuid4())


def test_a_column_by_many_keys_is_what_the_orm_reads_in_one_query(django_assert_num_queries):
    conversation = ConversationFactory()
    messages = [MessageFactory(conversation=conversation, seq=n, content=f"text {n}") for n in range(1, 6)]
    asked = [str(m.pk) for m in messages[:4]] + [m.pk.hex for m in messages[4:]] + [str(uuid.uuid4())]
    with django_assert_num_queries(1):
        got = column_by_pk(Message, "content", asked)
    assert got == {str(m.pk): m.content for m in messages}  # keys as str(uuid); an unknown key is left out
    with django_assert_num_queries(0):
        assert column_by_pk(Message, "content", []) == {}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the array literal is PostgreSQL's")
def test_a_key_that_could_change_the_array_literal_is_checked_before_it_is_sent():
    message = MessageFactory(conversation=ConversationFactory(), seq=1, content="kept")
    braced = "{" + str(message.pk) + "}"  # a form uuid.UUID reads, whose braces would end the literal
    assert column_by_pk(Message, "content", [braced]) == {str(message.pk): "kept"}
    with pytest.raises(ValueError):
        column_by_pk(Message, "content", [str(message.pk), "x},{" + str(uuid.uuid4())])


SEQS = FixedQuery(
    lambda conversation_id: Message.objects.filter(conversation_id=conversation_id).values_list(
        "seq", flat=True
    ),
    conversation_id=uuid.uuid4(),
)
postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="pipeline mode is PostgreSQL's"
)


@postgresql_only
def test_reads_ahead_answer_once_each_with_what_the_orm_gives(django_assert_num_queries):
    first, second = ConversationFactory(), ConversationFactory()
    for seq in (1, 2):
        MessageFactory(conversation=first, seq=seq)
    expected, expected_after_1 = list(_messages(first.pk, 0)), list(_messages(first.pk, 1))
    reads = [
        (ROWS, {"conversation_id": first.pk, "after": 0}),
        (ROWS, {"conversation_id": str(second.pk), "after": 0}),  # a string id is the same read
        (SEQS, {"conversation_id": first}),
    ]
    with django_assert_num_queries(3):  # sent together (pipeline mode), each still logged as a query
        block = read_ahead(reads)
        block.__enter__()
    try:
        with django_assert_num_queries(0):
            assert ROWS.run(conversation_id=str(first.pk), after=0) == expected
            assert ROWS.run(conversation_id=second.pk, after=0) == []
            assert sorted(SEQS.run(conversation_id=first.pk)) == [1, 2]
        with django_assert_num_queries(1):  # handed out once: a second run reads again
            assert sorted(SEQS.run(conversation_id=first.pk)) == [1, 2]
        with django_assert_num_queries(1):  # other values were not read ahead
            assert ROWS.run(conversation_id=first.pk, after=1) == expected_after_1
    finally:
        block.__exit__(None, None, None)
    with django_assert_num_queries(1):  # after the block every read runs
        ROWS.run(conversation_id=first.pk, after=0)


# 1 / divisor: a divisor of 0 fails in the database (a statement that fails as sent).
RATIOS = FixedQuery(
    lambda conversation_id, divisor: Message.objects.filter(conversation_id=conversation_id).values_list(
        RawSQL("1 / %s", (divisor,))
    ),
    conversation_id=uuid.uuid4(),
    divisor=7_123_456_789_019,
)


@postgresql_only
@pytest.mark.django_db(
    transaction=True
)  # autocommit, as a request runs: a failed statement ends nothing else
def test_a_read_ahead_that_fails_leaves_each_read_to_run_and_fail_where_it_is_asked_for():
    conversation = ConversationFactory()
    MessageFactory(conversation=conversation, seq=3)
    failing = (RATIOS, {"conversation_id": conversation.pk, "divisor": 0})
    with read_ahead([(SEQS, {"conversation_id": conversation.pk}), failing]):
        assert SEQS.run(conversation_id=conversation.pk) == [3]
        with pytest.raises(DataError):  # division by zero, as the read raises without reading ahead
            RATIOS.run(conversation_id=conversation.pk, divisor=0)
        assert RATIOS.run(conversation_id=conversation.pk, divisor=1) == [(1,)]
    assert SEQS.run(conversation_id=conversation.pk) == [3]  # the connection is usable


@pytest.mark.skipif(connection.vendor == "postgresql", reason="SQLite answers in process")
def test_sqlite_reads_nothing_ahead(django_assert_num_queries):
    conversation = ConversationFactory()
    MessageFactory(conversation=conversation, seq=1)
    with django_assert_num_queries(0), read_ahead([(SEQS, {"conversation_id": conversation.pk})]):
        pass
    with read_ahead([(SEQS, {"conversation_id": conversation.pk})]), django_assert_num_queries(1):
        assert SEQS.run(conversation_id=conversation.pk) == [1]


def _round_trips(action) -> tuple[int, list[str]]:
    """How often the client waited for PostgreSQL while `action` ran, from libpq's protocol trace of this
    connection: each run of messages it sent before the server's next answer is one round trip."""
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            action()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = [line.split("\t") for line in trace if line[:2] in {"F\t", "B\t"}]
    directions = [line[0] for line in lines]
    trips = sum(1 for i, d in enumerate(directions) if d == "F" and (i == 0 or directions[i - 1] == "B"))
    return trips, [f"{line[0]} {line[2].strip()}" for line in lines]


def _hint_and_usage(conversation) -> None:
    """A context call's records (context/prefix.py): its new prefix hints and its CacheUsage row."""
    level = PrefixLevel(level="B1", hash="h" * 64, tokens=10)
    prefix_hints_record(
        tenant=conversation.tenant, levels=[level], match=PrefixMatch(None, None, frozenset())
    )
    CacheUsage.objects.create(tenant_id=conversation.tenant_id, conversation=conversation, model="gpt-4o")


@postgresql_only
@pytest.mark.django_db(transaction=True)  # autocommit, as a request runs
def test_pipelined_writes_are_one_round_trip_where_a_transaction_of_their_own_is_four():
    conversation = ConversationFactory()
    connection.ensure_connection()

    def own_transaction():
        with transaction.atomic():
            _hint_and_usage(conversation)

    def pipelined():
        with writes_pipelined():
            _hint_and_usage(conversation)

    for _ in range(6):  # as in a server that has run them before: psycopg prepares the statements
        own_transaction(), pipelined()
    assert _round_trips(own_transaction)[0] == 4  # BEGIN, two inserts, COMMIT
    trips, sent = _round_trips(pipelined)
    assert trips == 1, "; ".join(sent)
    assert CacheUsage.objects.filter(conversation=conversation).count() == 14
    assert PrefixHint.objects.filter(tenant_id=conversation.tenant_id).count() == 1


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_pipelined_writes_are_one_implicit_transaction_and_a_failure_raises_djangos_error():
    conversation = ConversationFactory()
    taken = CacheUsage.objects.create(tenant_id=conversation.tenant_id, conversation=conversation)
    with pytest.raises(IntegrityError), writes_pipelined():
        PrefixHint.objects.create(tenant_id=conversation.tenant_id, level="B1", hash="k" * 64, token_count=1)
        CacheUsage.objects.create(id=taken.id, tenant_id=conversation.tenant_id, conversation=conversation)
    assert not PrefixHint.objects.filter(hash="k" * 64).exists()
    assert CacheUsage.objects.count() == 1  # and the connection answers


@pytest.mark.skipif(connection.vendor == "postgresql", reason="SQLite answers in process")
def test_sqlite_writes_each_statement_as_it_comes(django_assert_num_queries):
    conversation = ConversationFactory()
    with django_assert_num_queries(2), writes_pipelined():
        _hint_and_usage(conversation)
    assert CacheUsage.objects.filter(conversation=conversation).count() == 1
