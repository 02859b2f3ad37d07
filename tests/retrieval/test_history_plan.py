"""The index's catch-up reads (what was appended since the last context call) take the (conversation, seq)
range on PostgreSQL, whatever the other conversations' lengths: from the whole table's seq histogram alone,
`seq > n` looked like most rows beside a long conversation, and PostgreSQL read the shorter conversation's
whole history by its foreign key."""

import json

import pytest
from django.db import connection

from conversations.models import Conversation, Message, MessageVector
from conversations.services import conversation_create
from retrieval.history import _new_messages, _new_vectors

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's planner (set DATABASE_URL)"
)


def _fill(conversation, count: int) -> None:
    Message.objects.bulk_create(
        (
            Message(conversation=conversation, seq=seq, role="user", content=f"message {seq}", token_count=3)
            for seq in range(1, count + 1)
        ),
        batch_size=2000,
    )
    MessageVector.objects.bulk_create((
        MessageVector(
            message=message, conversation=conversation, seq=message.seq, model="m", dimension=1,
            spans=[[0, 1]], vectors=b"\0\0\0\0", content_sha256=f"{conversation.pk}-{message.seq}",
        )
        for message in Message.objects.filter(conversation=conversation)
    ), batch_size=2000)  # fmt: skip
    Conversation.objects.filter(pk=conversation.pk).update(last_seq=count)


def _plan(queryset) -> str:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        return json.dumps(cursor.fetchone()[0])


def test_catch_up_reads_take_the_seq_range_beside_a_long_conversation(owner):
    long = conversation_create(tenant=owner.tenant, title="long")
    short = conversation_create(tenant=owner.tenant, title="short")
    _fill(long, 20_000)
    _fill(short, 500)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE conversations_message")
        cursor.execute("ANALYZE conversations_messagevector")
    assert '"message_seq_unique"' in _plan(_new_messages(short.pk, 497))
    assert '"message_vector_conv_seq"' in _plan(_new_vectors(short.pk, "m", 497))
    assert [row[1] for row in _new_messages(short.pk, 497)] == [498, 499, 500]
    assert [row[0] for row in _new_vectors(short.pk, "m", 498)] == [498, 499, 500]
