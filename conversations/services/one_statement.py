"""PostgreSQL's path for one plain message: the seq reservation (which takes the conversation's row lock),
the active turn and the insert in one statement, so an append is one round trip instead of five (BEGIN,
lock, lookups, insert, COMMIT). It writes what the locked path writes."""

import contextlib
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from conversations.models import Conversation, Message
from conversations.services.announce import messages_announce
from conversations.services.intake import message_of_row
from conversations.services.sql import one_statement_params, one_statement_sql


def fits_one_statement(row: dict[str, Any]) -> bool:
    """A plain message (the common append): no images to store, no turn or parent to check, no usage."""
    return (
        connection.vendor == "postgresql"
        and row["turn_id"] is None
        and row["parent_id"] is None
        and row["usage"] is None
    )


def append_in_one_statement(conversation: Conversation, row: dict[str, Any]) -> Message | None:
    """The message appended in one statement. The active turn comes from mnemo_active_turn() (migration
    0004), which reads after the lock is held, as the locked path's reads do.

    None when the statement wrote nothing, and the caller takes the locked path, which answers each case:
    the key was used before (a replay), the conversation is gone, or a concurrent writer used the same key
    first (the unique constraint refused the insert, and the statement's update went with it).

    Kept because the append benchmark shows it pays (docs/benchmarks.md, Appends over HTTP); without that
    margin it goes back to the plain locked path."""
    now = timezone.now()
    message = message_of_row(conversation.pk, row, seq=0, turn_id=None, now=now)
    params = one_statement_params(conversation, message, now)
    # Inside a caller's transaction, a refused statement must not abort it: a savepoint takes the error.
    guard = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
    try:
        with guard, connection.cursor() as cursor:
            cursor.execute(one_statement_sql(message.idempotency_key is not None), params)
            found = cursor.fetchone()
    except IntegrityError:
        return None
    if found is None:
        return None
    message.seq, message.turn_id = found
    message._state.adding = False
    message._state.db = connection.alias
    conversation.last_seq = message.seq
    messages_announce(conversation, [message], committed=not connection.in_atomic_block)
    return message
