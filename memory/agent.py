"""The memory agent: after a completed exchange (in the background) it reads the new user messages and
decides what to remember. Rules here; LLM tool calls (core_memory_update, core_memory_append,
archival_memory_insert, archival_memory_search) when an LLM is configured are not built yet, and the run says
so. Every change goes through the memory services, so it is logged as a MemoryOperation (actor agent)."""

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from conversations.models import Conversation, Message
from memory.archival import archival_insert
from memory.models import Actor, ArchivalMemory, CoreMemoryBlock, MemoryAgentCursor
from memory.services import core_memory_write
from tenants.errors import ApplicationError

logger = logging.getLogger(__name__)

_SENTENCE = re.compile(r"(?<=[.!?。！？])\s*|\n+")
RULES: list[tuple[str, re.Pattern[str]]] = [
    ("remember", re.compile(r"^(?:please\s+)?remember(?:\s+that)?\s+(?P<fact>.{3,300})$", re.I)),
    ("name", re.compile(r"^(?:my name is|call me|i am called|i'm called)\s+(?P<name>[\w .'-]{2,60})$", re.I)),
    (
        "preference",
        re.compile(
            r"^i\s+(?:really\s+|always\s+|usually\s+)?(?:prefer|like|love|hate|dislike)\s+(?P<what>.{2,200})$",
            re.I,
        ),
    ),
    (
        "decision",
        re.compile(r"^(?:we decided|we agreed|decision:)\s*(?:to\s+|that\s+)?(?P<what>.{3,300})$", re.I),
    ),
    ("fact", re.compile(r"^(?:my|our)\s+[\w\s'-]{2,60}?\s+(?:is|are)\s+.{1,200}$", re.I)),
]


@dataclass
class AgentRun:
    processed_to: int = 0
    operations: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "rules"
    notes: list[str] = field(default_factory=list)


def _sentences(text: str) -> list[str]:
    return [s.strip().rstrip(".!。！") for s in _SENTENCE.split(text) if s and s.strip()]


def _append_core(end_user: Any, label: str, line: str, *, conversation: Conversation, trigger: str) -> bool:
    block = CoreMemoryBlock.objects.filter(end_user=end_user, label=label).first()
    if block is not None and line.lower() in block.value.lower():
        return False
    try:
        core_memory_write(
            end_user=end_user,
            label=label,
            append=line,
            expected_version=block.version if block else None,
            actor=Actor.AGENT,
            actor_name="rules",
            trigger=trigger,
            conversation=conversation,
        )
    except ApplicationError as exc:  # over the limit or raced by another writer: archival keeps the fact
        logger.info("memory agent skipped core memory %s: %s", label, exc.message)
        return False
    return True


def memory_agent_run(*, conversation: Conversation) -> AgentRun:
    """Process the user messages of completed exchanges since the cursor (idempotent: the cursor moves in the
    same transaction as the writes)."""
    run = AgentRun()
    if conversation.end_user_id is None:
        return run
    if settings.LLM_API_KEY or settings.LLM_BASE_URL:
        run.notes.append("LLM tool calls are not built yet: rules served.")
    with transaction.atomic():
        cursor, _ = MemoryAgentCursor.objects.get_or_create(conversation=conversation)
        cursor = MemoryAgentCursor.objects.select_for_update().get(pk=cursor.pk)
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
            run.processed_to = cursor.last_seq
            return run
        user_messages = Message.objects.filter(
            conversation=conversation,
            kind=Message.Kind.MESSAGE,
            role=Message.Role.USER,
            seq__gt=cursor.last_seq,
            seq__lte=last_done,
        ).order_by("seq")
        end_user = conversation.end_user
        for message in user_messages:
            for sentence in _sentences(message.content):
                _apply_rules(run, end_user, conversation, message, sentence)
        cursor.last_seq = last_done
        cursor.updated_at = timezone.now()
        cursor.save(update_fields=["last_seq", "updated_at"])
        run.processed_to = last_done
    return run


def _apply_rules(
    run: AgentRun, end_user: Any, conversation: Conversation, message: Message, sentence: str
) -> None:
    for rule, pattern in RULES:
        match = pattern.match(sentence)
        if match is None:
            continue
        trigger = f"rule:{rule} (message #{message.seq})"
        source = [str(message.id)]
        if rule == "name":
            name = match.group("name").strip()
            if _append_core(end_user, "profile", f"Name: {name}", conversation=conversation, trigger=trigger):
                run.operations.append({"op": "core_memory_append", "label": "profile", "rule": rule})
            return
        if rule == "preference":
            if _append_core(end_user, "preferences", sentence, conversation=conversation, trigger=trigger):
                run.operations.append({"op": "core_memory_append", "label": "preferences", "rule": rule})
            kind = ArchivalMemory.Kind.PREFERENCE
            content = sentence
        elif rule == "remember":
            kind, content = ArchivalMemory.Kind.FACT, match.group("fact").strip()
        elif rule == "decision":
            kind, content = ArchivalMemory.Kind.DECISION, sentence
        else:
            kind, content = ArchivalMemory.Kind.FACT, sentence
        outcome = archival_insert(
            end_user=end_user,
            content=content,
            kind=kind,
            conversation=conversation,
            source_message_ids=source,
            actor=Actor.AGENT,
            actor_name="rules",
            trigger=trigger,
        )
        run.operations.append(
            {"op": f"archival_memory_{outcome.action}", "id": str(outcome.memory.id), "rule": rule}
        )
        return


def memory_agent_request(*, conversation: Conversation) -> bool:
    """Queue a run after the current transaction commits when an exchange completed since the cursor."""
    if conversation.end_user_id is None:
        return False
    cursor_seq = (
        MemoryAgentCursor.objects.filter(conversation=conversation).values_list("last_seq", flat=True).first()
        or 0
    )
    pending = Message.objects.filter(
        conversation=conversation,
        kind=Message.Kind.MESSAGE,
        role=Message.Role.ASSISTANT,
        completed=True,
        seq__gt=cursor_seq,
    ).exists()
    if not pending:
        return False
    from memory.tasks import memory_agent_conversation

    conversation_id = str(conversation.id)
    transaction.on_commit(lambda: memory_agent_conversation.delay(conversation_id), robust=True)
    return True
