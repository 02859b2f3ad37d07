"""Turns: starting the next one (the active one ends first) and ending one, which applies the visual
compaction policy to its images. Both under the conversation's row lock, so a turn ends once."""

from typing import Any

from django.db import transaction
from django.utils import timezone

from conversations import visual
from conversations.events import event_publish
from conversations.models import Conversation, Turn
from conversations.serializers import TurnOutputSerializer


def _end_turn(turn: Turn, *, tenant_id: Any, now: Any, model: str) -> None:
    """End the turn and compact its images (under the conversation's row lock, so once)."""
    turn.status = Turn.Status.ENDED
    turn.ended_at = now
    turn.save(update_fields=["status", "ended_at"])
    event_publish(
        tenant_id=tenant_id,
        conversation_id=turn.conversation_id,
        event="turn.ended",
        data=TurnOutputSerializer(turn).data,
    )
    compaction = visual.turn_compact(turn=turn, model=model, now=now)
    if compaction is not None:
        event_publish(
            tenant_id=tenant_id,
            conversation_id=turn.conversation_id,
            event="turn.compacted",
            data={"turn": TurnOutputSerializer(turn).data, **compaction.as_dict()},
        )


def turn_start(*, conversation: Conversation) -> Turn:
    """Start the next turn; the active one, if any, ends first."""
    with transaction.atomic():
        locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
        now = timezone.now()
        previous = Turn.objects.filter(conversation=locked, status=Turn.Status.ACTIVE).first()
        if previous is not None:
            _end_turn(previous, tenant_id=locked.tenant_id, now=now, model=locked.model)
        index = locked.last_turn_index + 1
        turn = Turn.objects.create(conversation=locked, index=index, started_at=now)
        Conversation.objects.filter(pk=locked.pk).update(last_turn_index=index, updated_at=now)
        event_publish(
            tenant_id=locked.tenant_id,
            conversation_id=locked.id,
            event="turn.started",
            data=TurnOutputSerializer(turn).data,
        )
    return turn


def turn_end(*, turn: Turn) -> Turn:
    """End a turn. Ending an ended turn changes nothing and sends no second event."""
    with transaction.atomic():
        locked_conversation = Conversation.objects.select_for_update().get(pk=turn.conversation_id)
        locked = Turn.objects.get(pk=turn.pk)
        if locked.status == Turn.Status.ACTIVE:
            _end_turn(
                locked,
                tenant_id=locked_conversation.tenant_id,
                now=timezone.now(),
                model=locked_conversation.model,
            )
    return locked
