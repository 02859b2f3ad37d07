"""FixedQuery runs a queryset compiled once with other values: it must give what the ORM gives for the same
values (converted the same way), and refuse what it cannot compile faithfully."""

import uuid

import pytest
from django.db import DataError, connection
from django.db.models import F
from django.db.models.expressions import RawSQL

from conversations.models import Message
from summaries.models import SummarySegment
from tenants.statements import FixedQuery, column_by_pk, list_samples, list_values, read_ahead
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
