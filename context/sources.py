"""Where each block comes from. A source is a function that reads one block into the pipeline's state;
a capability that is not built has no source here, and its block is absent from the prompt.

B1 (agent profile) and B6 (history since the last compaction boundary) are loaded by the pipeline itself.
Summaries (B4), core memory (B2a), session profile (B2b), task state (B3) and retrieval (B5) register their
loaders in BLOCK_SOURCES as those capabilities land."""

from collections.abc import Callable
from typing import Any

from conversations.models import Conversation, Message

BLOCK_SOURCES: dict[str, Callable[[Any], None]] = {}


def boundary_seq(conversation: Conversation) -> int:
    """The seq of the last compaction boundary (0 before the first): B6 starts after it."""
    last = (
        Message.objects.filter(conversation=conversation, kind=Message.Kind.COMPACT_BOUNDARY)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    return last or 0
