"""Undo of one logged memory operation, whichever memory it changed: a core memory block (memory.services) or
an archival memory (memory.archival). It sits above both, as each logs its writes through memory.services."""

from django.db import transaction

from memory.archival import archival_revert
from memory.models import CoreMemoryBlock, MemoryOperation
from memory.services import core_memory_write
from tenants.errors import ApplicationError


@transaction.atomic
def operation_revert(
    *, operation: MemoryOperation, actor: str, actor_name: str = "", trigger: str = ""
) -> MemoryOperation | None:
    """Undo one operation by writing its old value back, as a new logged operation. Refused when the target
    changed since (someone else's later edit is never silently overwritten)."""
    operation = MemoryOperation.objects.select_for_update().get(pk=operation.pk)
    if operation.reverted_by_id is not None:
        raise ApplicationError(
            "This operation was already reverted.", code="already_reverted", status_code=409
        )
    kind, _, key = operation.target.partition(":")
    end_user = operation.end_user
    reason = trigger or f"revert of operation {operation.pk}"
    if kind == "core":
        block = CoreMemoryBlock.objects.select_for_update().filter(end_user=end_user, label=key).first()
        if block is None or block.value != operation.new_value:
            raise ApplicationError(
                f"Block {key!r} changed after this operation; revert the later change first.",
                code="target_changed",
                status_code=409,
            )
        block, _ = core_memory_write(
            end_user=end_user,
            label=key,
            value=operation.old_value,
            expected_version=block.version,
            actor=actor,
            actor_name=actor_name,
            trigger=reason,
            op=MemoryOperation.Op.CORE_REVERT,
        )
        revert = MemoryOperation.objects.filter(end_user=end_user, target=operation.target).first()
    elif kind == "archival":
        revert = archival_revert(operation=operation, actor=actor, actor_name=actor_name, trigger=reason)
    else:  # pragma: no cover - targets are written by memory.services and memory.archival
        raise ApplicationError("Unknown operation target.", code="invalid_target")
    MemoryOperation.objects.filter(pk=operation.pk).update(reverted_by=revert)
    return revert
