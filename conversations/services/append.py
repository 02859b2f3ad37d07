"""Appending messages: the batch is prepared outside the lock, then written under the conversation's row
lock (seqs reserved, replays answered with their original, turns and parents checked, images stored), or
in one statement when it is one plain message on PostgreSQL."""

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from rest_framework import status

from cold_storage.services import image_policy
from conversations import visual
from conversations.models import Conversation, Message, Turn
from conversations.services.announce import messages_announce
from conversations.services.intake import batch_check, idempotency_keys, items_prepare, message_of_row
from conversations.services.one_statement import append_in_one_statement, fits_one_statement
from conversations.services.sql import append_context, seqs_reserve
from conversations.signals import assistant_usage_reported
from tenants.errors import ApplicationError


@dataclass(frozen=True)
class AppendResult:
    message: Message
    created: bool


def message_append_batch(
    *,
    conversation: Conversation,
    items: list[dict[str, Any]],
    idempotency_key: str | None = None,
    uploads: dict[str, Any] | None = None,
) -> list[AppendResult]:
    """Append messages in order, all or nothing. A message whose idempotency key was seen before is not
    written again: its original is returned (created=False); the same key with different content is a 409.
    Image parts are validated before anything is written and stored with their message (``uploads`` holds
    the multipart files that parts name with "upload"); a refused batch leaves no row and no file."""
    batch_check(items)
    keys = idempotency_keys(items, idempotency_key)
    prepared = items_prepare(
        items, keys, tenant_id=conversation.tenant_id, model=conversation.model, uploads=uploads
    )
    intake = _intake_state(conversation, prepared)
    if intake is None and len(prepared) == 1 and fits_one_statement(prepared[0]):
        message = append_in_one_statement(conversation, prepared[0])
        if message is not None:
            return [AppendResult(message, created=True)]
    try:
        return _append_locked(conversation, prepared, keys, intake)
    except BaseException:
        if intake is not None:
            intake.blobs.discard()  # the rows rolled back; their files must not stay behind
        raise


def _intake_state(conversation: Conversation, prepared: list[dict[str, Any]]) -> visual.IntakeState | None:
    """What storing the batch's images carries from message to message; None when it names no image."""
    if not any(row["images"].pending for row in prepared):
        return None
    visual.references_check(tenant_id=conversation.tenant_id, batch=[row["images"] for row in prepared])
    return visual.IntakeState(
        tenant_id=conversation.tenant_id,
        conversation_id=conversation.pk,
        policy=image_policy(conversation.tenant.settings),
    )


def _append_locked(
    conversation: Conversation,
    prepared: list[dict[str, Any]],
    keys: list[str | None],
    intake: visual.IntakeState | None,
) -> list[AppendResult]:
    """The batch under the conversation's row lock: reserve its seqs, read what it refers to (replayed
    keys, named turns, parents), build each new message (a replay returns its original), then write them
    and announce them on commit. A batch of replays only writes nothing."""
    with transaction.atomic():
        now = timezone.now()
        first_seq = seqs_reserve(conversation, len(prepared), now)
        present_keys = [k for k in keys if k is not None]
        active_turn_id, any_seen = append_context(conversation, present_keys)
        existing = _messages_by_key(conversation, present_keys) if any_seen else {}
        turns = _turns_named(conversation, prepared)
        _parents_check(conversation, prepared)
        batch = _Batch(seq=first_seq)
        for index, row in enumerate(prepared):
            replayed = _replay_of(existing, row, index, tenant_id=conversation.tenant_id)
            if replayed is not None:
                batch.results.append(AppendResult(replayed, created=False))
                continue
            turn_id = _turn_for(row["turn_id"], turns, index=index, active_turn_id=active_turn_id)
            batch.seq += 1
            message = _message_build(
                conversation, row, seq=batch.seq, turn_id=turn_id, now=now, intake=intake
            )
            batch.add(message, row["usage"])
        if not batch.created:
            # Only replays: undo the reservation (and the updated_at it touched).
            transaction.set_rollback(True)
        else:
            _batch_write(conversation, batch, reserved_up_to=first_seq + len(prepared))
    conversation.last_seq = batch.seq
    return batch.results


@dataclass
class _Batch:
    """What an append under the lock has decided so far: the last seq given, the result of each item in
    order, the messages to create and the provider usage reported with them."""

    seq: int
    results: list[AppendResult] = dataclasses.field(default_factory=list)
    created: list[Message] = dataclasses.field(default_factory=list)
    usages: list[tuple[Message, dict[str, Any]]] = dataclasses.field(default_factory=list)

    def add(self, message: Message, usage: dict[str, Any] | None) -> None:
        self.created.append(message)
        self.results.append(AppendResult(message, created=True))
        if usage is not None:
            self.usages.append((message, usage))


def _messages_by_key(conversation: Conversation, keys: list[str]) -> dict[str, Message]:
    """The messages already stored under these idempotency keys."""
    return {
        m.idempotency_key: m
        for m in Message.objects.filter(conversation=conversation, idempotency_key__in=keys)
        if m.idempotency_key is not None  # always, by the filter
    }


def _turns_named(conversation: Conversation, prepared: list[dict[str, Any]]) -> dict[Any, Turn]:
    """The turns of this conversation the batch names (one that names another's is missing here)."""
    turn_ids = {row["turn_id"] for row in prepared if row["turn_id"] is not None}
    if not turn_ids:
        return {}
    return {t.id: t for t in Turn.objects.filter(conversation=conversation, id__in=turn_ids)}


def _parents_check(conversation: Conversation, prepared: list[dict[str, Any]]) -> None:
    """Each parent_id of the batch names a message of this conversation."""
    parent_ids = {row["parent_id"] for row in prepared if row["parent_id"] is not None}
    if not parent_ids:
        return
    found = set(
        Message.objects.filter(conversation=conversation, id__in=parent_ids).values_list("id", flat=True)
    )
    if parent_ids - found:
        raise ApplicationError(
            "parent_id must name an earlier message of this conversation.", code="invalid_parent"
        )


def _replay_of(
    existing: dict[str, Message], row: dict[str, Any], index: int, *, tenant_id: Any
) -> Message | None:
    """The stored original of an item whose idempotency key was seen before (409 when it differs)."""
    key = row["idempotency_key"]
    if key is None or key not in existing:
        return None
    if not _same_message(existing[key], row, tenant_id=tenant_id):
        raise ApplicationError(
            "This idempotency key was used for a different message.",
            code="idempotency_conflict",
            status_code=status.HTTP_409_CONFLICT,
            extra={"index": index, "message_id": str(existing[key].id)},
        )
    return existing[key]


def _same_message(existing: Message, prepared: dict[str, Any], *, tenant_id: Any) -> bool:
    # What the message says, and who says it, is compared; its metadata, flags and created_at are not: a
    # client that stamps each retry with its own clock is still sending the same message, and gets the
    # original back.
    if existing.role != prepared["role"] or existing.kind != prepared["kind"]:
        return False
    if existing.name != prepared["name"]:
        return False
    if existing.content != prepared["content"]:
        return False
    if not prepared["images"].pending:
        return existing.parts == prepared["parts"]
    return visual.comparable_parts(existing.parts, tenant_id=tenant_id) == visual.comparable_parts(
        prepared["parts"], tenant_id=tenant_id, pending=prepared["images"]
    )


def _turn_for(turn_id: Any, turns: dict[Any, Turn], *, index: int, active_turn_id: Any) -> Any:
    """The turn a new message joins: the one it names, which must be active, else the active one (if any)."""
    if turn_id is None:
        return active_turn_id
    turn = turns.get(turn_id)
    if turn is None:
        raise ApplicationError(
            "turn_id does not name a turn of this conversation.", code="invalid_turn", extra={"index": index}
        )
    if turn.status != Turn.Status.ACTIVE:
        raise ApplicationError(
            "That turn has ended; start a new turn to add messages.",
            code="turn_ended",
            status_code=status.HTTP_409_CONFLICT,
            extra={"index": index, "turn_id": str(turn_id)},
        )
    return turn_id


def _message_build(
    conversation: Conversation,
    row: dict[str, Any],
    *,
    seq: int,
    turn_id: Any,
    now: datetime,
    intake: visual.IntakeState | None,
) -> Message:
    """The unsaved message of a prepared row, with its new images stored."""
    message = message_of_row(conversation.pk, row, seq=seq, turn_id=turn_id, now=now)
    images = row["images"]
    if intake is not None and images.has_new:
        message.token_count += visual.intake_store(
            state=intake, message=message, message_images=images, model=conversation.model
        )
    return message


def _batch_write(conversation: Conversation, batch: _Batch, *, reserved_up_to: int) -> None:
    """Create the batch's messages, give back the seqs reserved for replays, pass on the usage reported with
    them and announce them (on commit)."""
    Message.objects.bulk_create(batch.created)
    if batch.seq != reserved_up_to:  # some were replays: give back their seqs
        Conversation.objects.filter(pk=conversation.pk).update(last_seq=batch.seq)
    for message, usage in batch.usages:
        assistant_usage_reported.send(sender=Message, conversation=conversation, message=message, usage=usage)
    messages_announce(conversation, batch.created)
