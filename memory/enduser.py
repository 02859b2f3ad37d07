"""An end user's data as a whole: export everything Mnemo holds about them, or delete all of it (memory,
conversations with their transcripts and images)."""

from typing import Any

from django.db import transaction

from conversations.models import Conversation, Message
from conversations.services import conversation_delete
from memory.archival import memory_data
from memory.models import ArchivalMemory, CoreMemoryBlock, MemoryOperation, StateEvent, TaskState
from memory.selectors import core_memory_block_data, core_memory_blocks, label_order, memory_operation_data
from tenants.models import EndUser


def end_user_export(*, end_user: EndUser) -> dict[str, Any]:
    """Everything Mnemo holds about the end user: core memory with each block's history, archival memories,
    the memory operation log and every conversation with its task state and messages."""
    blocks = core_memory_blocks(end_user=end_user)
    return {
        "external_id": end_user.external_id,
        "core_memory": [
            _core_block_export(block) for block in sorted(blocks, key=lambda b: label_order(b.label))
        ],
        "archival_memories": [
            memory_data(m) for m in ArchivalMemory.objects.filter(end_user=end_user).order_by("created_at")
        ],
        "memory_operations": [
            memory_operation_data(op)
            for op in MemoryOperation.objects.filter(end_user=end_user).order_by("created_at", "id")
        ],
        "conversations": [
            _conversation_export(conversation)
            for conversation in Conversation.objects.filter(end_user=end_user).order_by("created_at")
        ],
    }


def _core_block_export(block: CoreMemoryBlock) -> dict[str, Any]:
    return {
        **core_memory_block_data(block),
        "history": [
            {
                "version": v.version,
                "value": v.value,
                "updated_by": v.updated_by,
                "created_at": v.created_at,
            }
            for v in block.versions.order_by("version")
        ],
    }


def _conversation_export(conversation: Conversation) -> dict[str, Any]:
    return {
        "id": str(conversation.id),
        "title": conversation.title,
        "model": conversation.model,
        "metadata": conversation.metadata,
        "created_at": conversation.created_at,
        "archived_at": conversation.archived_at,
        "task_state": _task_state_export(conversation),
        "messages": [
            {
                "id": str(m.id),
                "seq": m.seq,
                "role": m.role,
                "name": m.name,
                "kind": m.kind,
                "content": m.content,
                "parts": m.parts,
                "created_at": m.created_at,
            }
            for m in Message.objects.filter(conversation=conversation).order_by("seq")
        ],
    }


def _task_state_export(conversation: Conversation) -> dict[str, Any]:
    task_state = TaskState.objects.filter(conversation=conversation).first()
    return {
        "epoch": task_state.epoch if task_state else 0,
        "base_epoch": task_state.base_epoch if task_state else 0,
        "base": task_state.state if task_state else {},
        "events": [
            {
                "epoch": e.epoch,
                "event_type": e.event_type,
                "payload": e.payload,
                "request_id": e.request_id,
            }
            for e in StateEvent.objects.filter(conversation=conversation).order_by("id")
        ],
    }


@transaction.atomic
def end_user_delete(*, end_user: EndUser) -> dict[str, int]:
    """Delete the end user and everything about them. Returns counts of what went."""
    counts = {
        "conversations": 0,
        "core_memory_blocks": CoreMemoryBlock.objects.filter(end_user=end_user).count(),
        "archival_memories": ArchivalMemory.objects.filter(end_user=end_user).count(),
        "memory_operations": MemoryOperation.objects.filter(end_user=end_user).count(),
    }
    for conversation in Conversation.objects.filter(end_user=end_user):
        conversation_delete(conversation=conversation)
        counts["conversations"] += 1
    end_user.delete()  # memory rows cascade
    return counts
