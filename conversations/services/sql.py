"""The hand-written SQL of the append paths: the seq reservation, the reads under the lock, and the
one-statement append. Table and column names come from the models; every value is a parameter."""

import functools
from typing import Any

from django.db import connection
from django.http import Http404

from conversations.models import Conversation, Message, Turn


def seqs_reserve(conversation: Conversation, count: int, now: Any) -> int:
    """Lock the conversation row and move last_seq past `count` new messages in one statement (the lock
    and the counter in one round trip: appends are the hottest write). Returns the seq before them."""
    quote = connection.ops.quote_name
    table = quote(Conversation._meta.db_table)
    pk = Conversation._meta.pk.get_db_prep_value(conversation.pk, connection)
    stamp = Conversation._meta.get_field("updated_at").get_db_prep_value(now, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {quote('last_seq')} = {quote('last_seq')} + %s, "  # noqa: S608
            f"{quote('updated_at')} = %s WHERE {quote('id')} = %s RETURNING {quote('last_seq')}",
            [count, stamp, pk],
        )
        row = cursor.fetchone()
    if row is None:  # deleted since the request fetched it
        raise Http404
    return row[0] - count


def append_context(conversation: Conversation, keys: list[str]) -> tuple[Any, bool]:
    """The active turn and whether any of the keys was used before, read in one statement under the lock
    (after it, so a writer we waited for is seen)."""
    quote = connection.ops.quote_name
    pk = Conversation._meta.pk.get_db_prep_value(conversation.pk, connection)
    turns, messages = quote(Turn._meta.db_table), quote(Message._meta.db_table)
    seen = "0"
    params: list[Any] = [pk, Turn.Status.ACTIVE]
    if keys:
        seen = (
            f"(SELECT COUNT(*) FROM {messages} WHERE {quote('conversation_id')} = %s "  # noqa: S608
            f"AND {quote('idempotency_key')} IN ({', '.join(['%s'] * len(keys))}))"
        )
        params += [pk, *keys]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (SELECT {quote('id')} FROM {turns} WHERE {quote('conversation_id')} = %s "  # noqa: S608
            f"AND {quote('status')} = %s ORDER BY {quote('index')} DESC LIMIT 1), {seen}",
            params,
        )
        turn_id, seen_count = cursor.fetchone()
    return (Turn._meta.pk.to_python(turn_id) if turn_id is not None else None), bool(seen_count)


@functools.cache
def one_statement_sql(with_key: bool) -> str:
    """The one-statement append. Parameters: updated_at, the conversation (twice more with the key and the
    key), then one per message column in _meta order, seq excepted, the conversation in turn_id's place."""
    quote = connection.ops.quote_name
    conversations, messages = quote(Conversation._meta.db_table), quote(Message._meta.db_table)
    fields = Message._meta.concrete_fields
    values = {"seq": "reserved.last_seq", "turn_id": "mnemo_active_turn(%s)"}
    unused = (
        f" AND NOT EXISTS (SELECT 1 FROM {messages} WHERE {quote('conversation_id')} = %s "  # noqa: S608
        f"AND {quote('idempotency_key')} = %s)"
        if with_key
        else ""
    )
    return (
        f"WITH reserved AS (UPDATE {conversations} SET {quote('last_seq')} = {quote('last_seq')} + 1, "  # noqa: S608
        f"{quote('updated_at')} = %s WHERE {quote('id')} = %s{unused} RETURNING {quote('last_seq')}) "
        f"INSERT INTO {messages} ({', '.join(quote(f.column) for f in fields)}) "
        f"SELECT {', '.join(values.get(f.attname, '%s') for f in fields)} FROM reserved "
        f"RETURNING {quote('seq')}, {quote('turn_id')}"
    )


def one_statement_params(conversation: Conversation, message: Message, now: Any) -> list[Any]:
    """The parameters of one_statement_sql for this unsaved message, in its order."""
    pk = Conversation._meta.pk.get_db_prep_value(conversation.pk, connection)
    # The conversation changed now, whenever the client says the message was written.
    stamp = Conversation._meta.get_field("updated_at").get_db_prep_value(now, connection)
    key = message.idempotency_key
    params: list[Any] = [stamp, pk] + ([pk, key] if key is not None else [])
    for field in Message._meta.concrete_fields:
        if field.attname == "turn_id":
            params.append(pk)  # mnemo_active_turn's argument
        elif field.attname != "seq":
            params.append(field.get_db_prep_save(getattr(message, field.attname), connection))
    return params
