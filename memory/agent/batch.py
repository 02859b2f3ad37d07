"""What the memory agent reads in one step: a batch of whole exchanges after its cursor."""

from dataclasses import dataclass

from conversations.models import Conversation, Message
from memory.models import MemoryAgentCursor

# One message counts (and is shown to the model) up to this many characters: a long paste rarely hides a
# fact about the user past its start.
MESSAGE_CHARS = 4_000


@dataclass
class Batch:
    from_seq: int  # the cursor when the batch was read
    to_seq: int  # the last completed assistant message in the batch
    messages: list[Message]  # user and assistant messages in (from_seq, to_seq]
    pending: bool  # completed exchanges after to_seq wait for the next batch


def batch_read(conversation: Conversation, *, max_chars: int | None) -> tuple[int, Batch | None]:
    """(cursor, the next batch or None). Read without locks: the apply step re-checks the cursor."""
    cursor, _ = MemoryAgentCursor.objects.get_or_create(conversation=conversation)
    last_done = (
        Message.objects.filter(
            conversation=conversation,
            kind=Message.Kind.MESSAGE,
            role=Message.Role.ASSISTANT,
            completed=True,
            seq__gt=cursor.last_seq,
        )
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    if last_done is None:
        return cursor.last_seq, None
    messages = list(
        Message.objects.filter(
            conversation=conversation,
            kind=Message.Kind.MESSAGE,
            role__in=[Message.Role.USER, Message.Role.ASSISTANT],
            seq__gt=cursor.last_seq,
            seq__lte=last_done,
        ).order_by("seq")
    )
    to_seq = last_done
    if max_chars is not None:
        # Whole exchanges only: cut after the last completed reply that still fits (the first always counts).
        used, cut = 0, None
        for message in messages:
            used += min(len(message.content), MESSAGE_CHARS)
            if used > max_chars and cut is not None:
                break
            if message.role == Message.Role.ASSISTANT and message.completed:
                cut = message.seq
        to_seq = cut if cut is not None else last_done
    batch = [m for m in messages if m.seq <= to_seq]
    return cursor.last_seq, Batch(cursor.last_seq, to_seq, batch, pending=to_seq < last_done)
