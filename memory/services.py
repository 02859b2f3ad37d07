"""Writes to memory. Core-memory edits are optimistic: the caller names the version it read, a stale version
is refused (412) rather than overwritten, and every change is logged as a MemoryOperation."""

import uuid
from typing import Any, TypedDict

from django.db import transaction
from django.utils import timezone
from rest_framework import status

from conversations.models import Conversation
from memory.models import (
    DEFAULT_CHAR_LIMIT,
    Actor,
    CoreMemoryBlock,
    CoreMemoryBlockVersion,
    CoreMemorySnapshot,
    MemoryOperation,
)
from tenants.errors import ApplicationError
from tenants.models import EndUser
from tenants.statements import FixedQuery, Read


def operation_log(
    *,
    end_user: EndUser,
    op: str,
    target: str,
    old_value: str = "",
    new_value: str = "",
    trigger: str = "",
    actor: str,
    actor_name: str = "",
    conversation: Conversation | None = None,
    details: dict[str, Any] | None = None,
) -> MemoryOperation:
    return MemoryOperation.objects.create(
        tenant_id=end_user.tenant_id,
        end_user=end_user,
        conversation=conversation,
        op=op,
        target=target,
        old_value=old_value,
        new_value=new_value,
        trigger=trigger,
        actor=actor,
        actor_name=actor_name,
        details=details or {},
    )


def _check_limit(value: str, char_limit: int) -> None:
    if len(value) > char_limit:
        raise ApplicationError(
            f"The value has {len(value)} characters; the block's limit is {char_limit}.",
            code="over_char_limit",
            status_code=status.HTTP_422_UNPROCESSABLE_ENTITY,
            extra={"length": len(value), "char_limit": char_limit},
        )


def _check_version(block: CoreMemoryBlock, expected_version: int | None, *, required: bool) -> None:
    if expected_version is None:
        if required:
            raise ApplicationError(
                f"Block {block.label!r} exists: send If-Match with the version you read "
                f"(current {block.version}).",
                code="if_match_required",
                status_code=status.HTTP_428_PRECONDITION_REQUIRED,
                extra={"version": block.version},
            )
        return
    if expected_version != block.version:
        raise ApplicationError(
            f"Block {block.label!r} is at version {block.version}, not {expected_version}: "
            "someone changed it since you read it.",
            code="version_mismatch",
            status_code=status.HTTP_412_PRECONDITION_FAILED,
            extra={"version": block.version, "value": block.value},
        )


def _record_version(block: CoreMemoryBlock) -> None:
    CoreMemoryBlockVersion.objects.create(
        block=block,
        version=block.version,
        value=block.value,
        char_limit=block.char_limit,
        updated_by=block.updated_by,
        created_at=block.updated_at,
    )


class _LogFields(TypedDict):
    """Who and what caused a core-memory write, as its MemoryOperation records it."""

    trigger: str
    actor: str
    actor_name: str
    conversation: Conversation | None


@transaction.atomic
def core_memory_write(
    *,
    end_user: EndUser,
    label: str,
    value: str | None = None,
    append: str | None = None,
    char_limit: int | None = None,
    expected_version: int | None = None,
    require_version: bool = True,
    create: bool = True,
    actor: str = Actor.API,
    actor_name: str = "",
    trigger: str = "",
    conversation: Conversation | None = None,
    op: str | None = None,
) -> tuple[CoreMemoryBlock, bool]:
    """Create or change one block. Returns (block, created). `value` replaces, `append` adds a line. An
    existing block is changed only at `expected_version` (412 otherwise; 428 when required and missing)."""
    block = CoreMemoryBlock.objects.select_for_update().filter(end_user=end_user, label=label).first()
    log = _LogFields(trigger=trigger, actor=actor, actor_name=actor_name, conversation=conversation)
    if block is None:
        if not create:
            raise ApplicationError(f"No core memory block {label!r}.", code="not_found", status_code=404)
        if expected_version not in (None, 0):
            raise ApplicationError(
                f"Block {label!r} does not exist (If-Match {expected_version}).",
                code="version_mismatch",
                status_code=status.HTTP_412_PRECONDITION_FAILED,
                extra={"version": None},
            )
        new_value = value if value is not None else (append or "")
        return _core_block_create(
            end_user=end_user, label=label, value=new_value, char_limit=char_limit, log=log
        ), True

    _check_version(block, expected_version, required=require_version)
    new_value = block.value if value is None else value
    if append:
        new_value = f"{new_value}\n{append}" if new_value else append
    if op is None:
        op = MemoryOperation.Op.CORE_APPEND if append and value is None else MemoryOperation.Op.CORE_UPDATE
    _core_block_change(
        block, end_user=end_user, value=new_value, char_limit=char_limit or block.char_limit, op=op, log=log
    )
    return block, False


def _core_block_create(
    *, end_user: EndUser, label: str, value: str, char_limit: int | None, log: _LogFields
) -> CoreMemoryBlock:
    """A new block at version 1, its version row and its logged operation; `log` holds the operation's
    trigger, actor, actor_name and conversation."""
    limit = char_limit or DEFAULT_CHAR_LIMIT
    _check_limit(value, limit)
    block = CoreMemoryBlock.objects.create(
        tenant_id=end_user.tenant_id,
        end_user=end_user,
        label=label,
        value=value,
        char_limit=limit,
        version=1,
        updated_by=log["actor_name"] or log["actor"],
        updated_at=timezone.now(),
    )
    _record_version(block)
    operation_log(
        end_user=end_user, op=MemoryOperation.Op.CORE_CREATE, target=f"core:{label}", new_value=value, **log
    )
    return block


def _core_block_change(
    block: CoreMemoryBlock, *, end_user: EndUser, value: str, char_limit: int, op: str, log: _LogFields
) -> None:
    """The block (locked by the caller) at its next version, its version row and its logged operation;
    nothing at all when neither the value nor the limit changes (no new version, the cache stays warm)."""
    _check_limit(value, char_limit)
    if value == block.value and char_limit == block.char_limit:
        return
    old_value = block.value
    block.value = value
    block.char_limit = char_limit
    block.version += 1
    block.updated_by = log["actor_name"] or log["actor"]
    block.updated_at = timezone.now()
    block.save(update_fields=["value", "char_limit", "version", "updated_by", "updated_at"])
    _record_version(block)
    operation_log(
        end_user=end_user,
        op=op,
        target=f"core:{block.label}",
        old_value=old_value,
        new_value=value,
        **log,
    )


# --- B2a snapshot: what the system message shows ---------------------------------------------------------


def _current_versions(end_user_id: Any) -> dict[str, int]:
    return dict(CoreMemoryBlock.objects.filter(end_user_id=end_user_id).values_list("label", "version"))


# Read by every context call of an end user's conversation: compiled once (tenants.statements).
_SNAPSHOT = FixedQuery(
    lambda conversation_id: CoreMemorySnapshot.objects.filter(conversation_id=conversation_id)[:1],
    conversation_id=uuid.UUID(int=0x5A7),
)


def core_memory_snapshot_reads(conversation: Conversation) -> list[Read]:
    """The snapshot read of a context call, for reading it ahead (tenants.statements)."""
    return [(_SNAPSHOT, {"conversation_id": conversation.pk})]


def core_memory_snapshot_get(*, conversation: Conversation, boundary_seq: int) -> CoreMemorySnapshot:
    """The conversation's B2a snapshot: taken at its first context call, advanced when the compaction
    boundary has moved past it (the receiver of boundary_moved advances it too; this catches a missed
    signal)."""
    snapshot = _SNAPSHOT.first(conversation_id=conversation.pk)
    if snapshot is None:
        snapshot, _ = CoreMemorySnapshot.objects.get_or_create(
            conversation=conversation,
            defaults={"versions": _current_versions(conversation.end_user_id), "boundary_seq": boundary_seq},
        )
    elif boundary_seq > snapshot.boundary_seq:
        snapshot = core_memory_snapshot_advance(conversation=conversation, boundary_seq=boundary_seq)
    return snapshot


def core_memory_snapshot_read(
    *, conversation: Conversation, boundary_seq: int
) -> tuple[CoreMemorySnapshot, bool]:
    """The snapshot core_memory_snapshot_get returns, without writing it (a context call writes after its
    stages): (the snapshot, whether core_memory_snapshot_get must still store it)."""
    snapshot = _SNAPSHOT.first(conversation_id=conversation.pk)
    if snapshot is not None and boundary_seq <= snapshot.boundary_seq:
        return snapshot, False
    versions = _current_versions(conversation.end_user_id)
    return CoreMemorySnapshot(conversation=conversation, versions=versions, boundary_seq=boundary_seq), True


def core_memory_snapshot_advance(*, conversation: Conversation, boundary_seq: int) -> CoreMemorySnapshot:
    """Fold the edits made since the last boundary into B2a: the snapshot takes the current versions."""
    versions = _current_versions(conversation.end_user_id)
    snapshot, created = CoreMemorySnapshot.objects.get_or_create(
        conversation=conversation, defaults={"versions": versions, "boundary_seq": boundary_seq}
    )
    if not created and boundary_seq >= snapshot.boundary_seq:
        # Conditional: a concurrent advance to a later boundary is not rolled back.
        CoreMemorySnapshot.objects.filter(pk=snapshot.pk, boundary_seq__lte=boundary_seq).update(
            versions=versions, boundary_seq=boundary_seq, updated_at=timezone.now()
        )
        snapshot.refresh_from_db()
    return snapshot
