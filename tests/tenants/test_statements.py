"""FixedQuery runs a queryset compiled once with other values: it must give what the ORM gives for the same
values (converted the same way), and refuse what it cannot compile faithfully."""

import uuid

import pytest

from conversations.models import Message
from summaries.models import SummarySegment
from tenants.statements import FixedQuery, column_by_pk
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
