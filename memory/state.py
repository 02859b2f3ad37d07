"""Task state (B3) and the session profile (B2b, the "session_profile" key of the same state): events are
appended durably at an expected epoch, each advancing the epoch by one, folded into the base now and then,
and the ones after the base applied on read (the overlay)."""

import copy
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, F, Min, Q
from django.utils import timezone
from rest_framework import status

from conversations.models import Conversation
from memory.models import StateEvent, TaskState
from tenants.errors import ApplicationError
from tenants.statements import FixedQuery, Read

SESSION_PROFILE_KEY = "session_profile"
MAX_STATE_CHARS = 200_000


class InvalidEvent(ValueError):
    pass


def _walk(state: dict[str, Any], path: list[str], *, create: bool) -> dict[str, Any]:
    node = state
    for key in path:
        child = node.get(key)
        if child is None and create:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise InvalidEvent(f"{'.'.join(path)}: {key!r} is not an object")
        node = child
    return node


def event_apply(state: dict[str, Any], event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
    """A new state with one event applied. Paths are dot-separated keys ('' or absent: the root)."""
    state = copy.deepcopy(state)
    path = [p for p in str(payload.get("path") or "").split(".") if p]
    if event_type == StateEvent.Type.MERGE:
        value = payload.get("value")
        if not isinstance(value, dict):
            raise InvalidEvent("merge needs an object value")
        _walk(state, path, create=True).update(copy.deepcopy(value))
        return state
    if not path:
        raise InvalidEvent(f"{event_type} needs a path")
    parent = _walk(state, path[:-1], create=event_type != StateEvent.Type.DELETE)
    key = path[-1]
    if event_type == StateEvent.Type.SET:
        parent[key] = copy.deepcopy(payload.get("value"))
    elif event_type == StateEvent.Type.DELETE:
        parent.pop(key, None)
    elif event_type == StateEvent.Type.APPEND:
        current = parent.setdefault(key, [])
        if not isinstance(current, list):
            raise InvalidEvent(f"{'.'.join(path)} is not a list")
        current.append(copy.deepcopy(payload.get("value")))
    else:
        raise InvalidEvent(f"unknown event type {event_type!r}")
    return state


@dataclass
class Overlay:
    state: dict[str, Any]
    base: dict[str, Any]
    epoch: int
    base_epoch: int
    pending: list[StateEvent]


def _task_state(conversation: Conversation, *, lock: bool = False) -> TaskState:
    task_state = _TASK_STATE.first(conversation_id=conversation.pk)
    if task_state is None:
        try:
            with transaction.atomic():
                task_state = TaskState.objects.create(conversation=conversation)
        except IntegrityError:
            task_state = TaskState.objects.get(conversation=conversation)
    if lock:
        task_state = TaskState.objects.select_for_update().get(pk=task_state.pk)
    return task_state


# Read on every context call: a fixed statement (tenants.statements); first() ordered by the pk.
_TASK_STATE = FixedQuery(
    lambda conversation_id: TaskState.objects.filter(conversation_id=conversation_id).order_by("pk")[:1],
    conversation_id=uuid.uuid4(),
)


def task_state_reads(conversation: Conversation) -> list[Read]:
    """state_overlay's first read, for reading it ahead (tenants.statements)."""
    return [(_TASK_STATE, {"conversation_id": conversation.pk})]


def state_overlay(*, conversation: Conversation) -> Overlay:
    """The base state with the events after its epoch applied in epoch order (events are validated on append,
    so a stored event always applies; one that does not is skipped rather than failing the read)."""
    task_state = _TASK_STATE.first(conversation_id=conversation.pk)
    if task_state is None:
        return Overlay(state={}, base={}, epoch=0, base_epoch=0, pending=[])
    pending = list(
        StateEvent.objects.filter(conversation=conversation, epoch__gt=task_state.base_epoch).order_by(
            "epoch"
        )
    )
    state = task_state.state
    for event in pending:
        try:
            state = event_apply(state, event.event_type, event.payload)
        except InvalidEvent:
            continue
    return Overlay(
        state=state,
        base=task_state.state,
        epoch=task_state.epoch,
        base_epoch=task_state.base_epoch,
        pending=pending,
    )


def _epoch_moved(epoch: int) -> ApplicationError:
    return ApplicationError(
        f"The task state is at epoch {epoch}: read it again.",
        code="epoch_moved",
        status_code=status.HTTP_409_CONFLICT,
        extra={"epoch": epoch},
    )


@transaction.atomic
def state_event_append(
    *,
    conversation: Conversation,
    expected_epoch: int,
    request_id: str,
    event_type: str,
    payload: dict[str, Any],
) -> tuple[StateEvent, bool]:
    """Append one event, durably (a row, committed with the request), and advance the epoch by one. Returns
    (event, created); a repeated request_id returns the original event. 409 when the epoch moved since the
    caller read it, so of two writers that read the same epoch only the first is accepted."""
    task_state = _task_state(conversation, lock=True)  # serialises appends and folds of this conversation
    existing = StateEvent.objects.filter(conversation=conversation, request_id=request_id).first()
    if existing is not None:
        return existing, False
    if expected_epoch != task_state.epoch:
        raise _epoch_moved(task_state.epoch)
    current = state_overlay(conversation=conversation).state
    try:
        if not isinstance(payload.get("path", ""), str):  # new events only: stored ones took str(path)
            raise InvalidEvent("path must be a string of dot-separated keys")
        after = event_apply(current, event_type, payload)
    except InvalidEvent as exc:
        raise ApplicationError(f"The event does not apply: {exc}.", code="invalid_event") from None
    if len(str(after)) > MAX_STATE_CHARS:
        raise ApplicationError("The task state would be too large.", code="state_too_large")
    # Conditional on the epoch read, so it holds where the row lock is a no-op (SQLite); the unique
    # (conversation, epoch) constraint is the last guard.
    advanced = TaskState.objects.filter(pk=task_state.pk, epoch=expected_epoch).update(
        epoch=expected_epoch + 1, updated_at=timezone.now()
    )
    if not advanced:
        raise _epoch_moved(TaskState.objects.get(pk=task_state.pk).epoch)
    event = StateEvent.objects.create(
        conversation=conversation,
        epoch=expected_epoch + 1,
        event_type=event_type,
        payload=payload,
        request_id=request_id,
    )
    return event, True


@transaction.atomic
def state_fold(*, conversation: Conversation) -> int:
    """Fold the pending events into the base. The epoch stays: the state it names is the same. Returns how
    many events folded."""
    _task_state(conversation, lock=True)
    overlay = state_overlay(conversation=conversation)
    if not overlay.pending:
        return 0
    TaskState.objects.filter(conversation=conversation).update(
        state=overlay.state, base_epoch=overlay.pending[-1].epoch, updated_at=timezone.now()
    )
    return len(overlay.pending)


def state_fold_due(*, min_events: int, min_age_seconds: int) -> list[Any]:
    """Conversations whose unfolded events are many or old enough to fold (one query)."""
    cutoff = timezone.now() - timedelta(seconds=min_age_seconds)
    rows = (
        StateEvent.objects.filter(epoch__gt=F("conversation__task_state__base_epoch"))
        .values("conversation_id")
        .annotate(n=Count("id"), oldest=Min("created_at"))
        .filter(Q(n__gte=min_events) | Q(oldest__lte=cutoff))
    )
    return [row["conversation_id"] for row in rows]
