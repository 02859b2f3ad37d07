"""Writes to conversations, turns and messages. `seq` and turn indexes are assigned under a row lock on
the conversation, so concurrent writers (threads, processes, hosts) never gap or collide. The parts live in
the modules named for them; this package hands on the names its callers import."""

from conversations.services.append import AppendResult, message_append_batch
from conversations.services.checks import (
    MESSAGE_NAME_MAX,
    MESSAGE_TIME_AHEAD,
    MESSAGE_TIME_EARLIEST,
    message_name_check,
    message_size,
    message_time_check,
)
from conversations.services.conversation import (
    conversation_create,
    conversation_delete,
    conversation_update,
    default_model,
)
from conversations.services.records import compaction_records_append
from conversations.services.turns import turn_end, turn_start
from conversations.services.update import message_update
from conversations.tokens import message_token_count

__all__ = [
    "MESSAGE_NAME_MAX",
    "MESSAGE_TIME_AHEAD",
    "MESSAGE_TIME_EARLIEST",
    "AppendResult",
    "compaction_records_append",
    "conversation_create",
    "conversation_delete",
    "conversation_update",
    "default_model",
    "message_append_batch",
    "message_name_check",
    "message_size",
    "message_time_check",
    "message_token_count",
    "message_update",
    "turn_end",
    "turn_start",
]
