"""Reads of memory, always inside one tenant (through the end user or conversation already fetched)."""

import uuid
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, QuerySet
from django.db.models.functions import Coalesce

from conversations.models import Conversation, Message
from memory.models import (
    STANDARD_LABELS,
    ArchivalMemory,
    CoreMemoryBlock,
    CoreMemoryBlockVersion,
    MemoryAgentCursor,
    MemoryOperation,
)
from tenants.models import EndUser
from tenants.statements import FixedQuery, Read


def label_order(label: str) -> tuple[int, str]:
    """persona, preferences, instructions, profile, then custom labels alphabetically: a fixed order, so B2a
    is stable."""
    if label in STANDARD_LABELS:
        return (STANDARD_LABELS.index(label), "")
    return (len(STANDARD_LABELS), label)


def core_memory_blocks(*, end_user: EndUser) -> list[CoreMemoryBlock]:
    blocks = list(CoreMemoryBlock.objects.filter(end_user=end_user))
    return sorted(blocks, key=lambda b: label_order(b.label))


def core_memory_block_data(block: CoreMemoryBlock) -> dict[str, Any]:
    return {
        "label": block.label,
        "value": block.value,
        "char_limit": block.char_limit,
        "chars": len(block.value),
        "version": block.version,
        "updated_by": block.updated_by,
        "updated_at": block.updated_at,
    }


def core_memory_at(
    *, end_user_id: int, versions: dict[str, int], current: list[CoreMemoryBlock]
) -> dict[str, str]:
    """label -> value of the named versions (a label whose version is gone is left out). `current`: the
    end user's blocks as core_memory_blocks_current read them; a version that is still current is taken from
    there, so only blocks edited since are looked up in their history."""
    held = {b.label: b.value for b in current if versions.get(b.label) == b.version}
    older = [label for label in versions if label not in held]
    if not older:
        return held
    rows = CoreMemoryBlockVersion.objects.filter(
        block__end_user_id=end_user_id, block__label__in=older
    ).values_list("block__label", "version", "value")
    return held | {label: value for label, version, value in rows if versions.get(label) == version}


def memory_operations(*, end_user: EndUser) -> QuerySet[MemoryOperation]:
    return MemoryOperation.objects.filter(end_user=end_user).select_related("conversation")


def memory_operation_data(op: MemoryOperation) -> dict[str, Any]:
    return {
        "id": op.pk,
        "op": op.op,
        "target": op.target,
        "old_value": op.old_value,
        "new_value": op.new_value,
        "trigger": op.trigger,
        "actor": op.actor,
        "actor_name": op.actor_name,
        "conversation_id": op.conversation_id,
        "reverted_by": op.reverted_by_id,
        "details": op.details,
        "created_at": op.created_at,
    }


# Read by every context call of an end user's conversation: compiled once (tenants.statements).
_CURRENT_BLOCKS = FixedQuery(
    lambda end_user_id: CoreMemoryBlock.objects.filter(end_user_id=end_user_id).only(
        "label", "value", "version"
    ),
    end_user_id=-7_000_001,
)
_ARCHIVAL_EXISTS = FixedQuery(
    lambda end_user_id: ArchivalMemory.objects.filter(
        end_user_id=end_user_id, invalidated_at__isnull=True
    ).values_list("pk", flat=True)[:1],
    end_user_id=-7_000_001,
)


def core_memory_blocks_reads(end_user_id: int) -> list[Read]:
    """core_memory_blocks_current's read, for reading it ahead (tenants.statements)."""
    return [(_CURRENT_BLOCKS, {"end_user_id": end_user_id})]


def archival_exists_reads(end_user_id: int) -> list[Read]:
    """archival_exists' read, for reading it ahead (tenants.statements)."""
    return [(_ARCHIVAL_EXISTS, {"end_user_id": end_user_id})]


def core_memory_blocks_current(*, end_user_id: int) -> list[CoreMemoryBlock]:
    return sorted(_CURRENT_BLOCKS.run(end_user_id=end_user_id), key=lambda b: label_order(b.label))


def archival_exists(*, end_user_id: int) -> bool:
    return _ARCHIVAL_EXISTS.first(end_user_id=end_user_id) is not None


def _completed_replies() -> QuerySet[Message]:
    """What the memory agent reads a conversation up to: an exchange is complete with its assistant reply
    (compaction records do not count)."""
    return Message.objects.filter(kind=Message.Kind.MESSAGE, role=Message.Role.ASSISTANT, completed=True)


def memory_agent_progress(*, conversation: Conversation) -> dict[str, Any]:
    """How far the memory agent has read the conversation, for a client that imported history and waits
    for its memories (GET /api/v1/conversations/{id}/memory-agent): `read_to_seq`, and `pending` while a
    completed exchange after it is unread. A conversation without an end user has no memory agent."""
    if conversation.end_user_id is None:
        return {"enabled": False, "read_to_seq": 0, "pending": False}
    cursor = MemoryAgentCursor.objects.filter(conversation=conversation).values_list("last_seq", flat=True)
    read_to = next(iter(cursor), 0)
    pending = _completed_replies().filter(conversation=conversation, seq__gt=read_to).exists()
    return {"enabled": True, "read_to_seq": read_to, "pending": pending}


def memory_agent_due(*, since: datetime, limit: int) -> list[uuid.UUID]:
    """End users' conversations updated since `since` with a completed exchange the memory agent has not
    read (a run that was lost: the queue of a stopped server, a broker that was down), newest first, at most
    `limit`. An exchange is complete with its assistant reply; compaction records do not count."""
    unread = _completed_replies().filter(
        conversation=OuterRef("pk"), seq__gt=Coalesce(OuterRef("memory_agent_cursor__last_seq"), 0)
    )
    return list(
        Conversation.objects.filter(end_user__isnull=False, updated_at__gte=since)
        .filter(Exists(unread))
        .order_by("-updated_at")
        .values_list("pk", flat=True)[:limit]
    )
