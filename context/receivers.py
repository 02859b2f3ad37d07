"""Receivers that connect sibling apps below context: at a compaction boundary the core-memory edits made
since the last one are folded into B2a (the system message changes there anyway)."""

from typing import Any

from conversations.models import Conversation
from memory.services import core_memory_snapshot_advance
from summaries.selectors import history_start_seq


def fold_core_memory(sender: Any, *, conversation_id: Any, **kwargs: Any) -> None:
    conversation = Conversation.objects.filter(pk=conversation_id).first()
    if conversation is None or conversation.end_user_id is None:
        return
    core_memory_snapshot_advance(conversation=conversation, boundary_seq=history_start_seq(conversation))
