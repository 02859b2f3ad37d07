"""Receivers that connect sibling apps below context: at a compaction boundary the core-memory edits made
since the last one are folded into B2a (the system message changes there anyway), and a window cut that
reached past the new boundary is taken back, so B6 resumes right after what the summary covers."""

import uuid
from typing import Any

from context.models import ConversationContext
from conversations.models import Conversation
from memory.services import core_memory_snapshot_advance
from summaries.selectors import history_start_seq


def fold_core_memory(sender: object, *, conversation_id: uuid.UUID | str, **kwargs: Any) -> None:
    conversation = Conversation.objects.filter(pk=conversation_id).first()
    if conversation is None or conversation.end_user_id is None:
        return
    core_memory_snapshot_advance(conversation=conversation, boundary_seq=history_start_seq(conversation))


def resume_window_at_boundary(
    sender: object, *, conversation_id: uuid.UUID | str, end_seq: int, **kwargs: Any
) -> None:
    """A prompt-only window cut made before this compaction may start after its end: the messages between
    would be in neither the summary nor the history."""
    ConversationContext.objects.filter(conversation_id=conversation_id, window_start_seq__gt=end_seq).update(
        window_start_seq=end_seq
    )
