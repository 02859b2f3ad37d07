"""What the memory agent's rules write: a standing instruction or preference as a line of core memory, a name
in the `profile` block, the rest as archival memories, each a MemoryOperation of actor agent named "rules"
whose trigger names the rule and the message #seq."""

import logging
import re
from typing import Any

from conversations.models import Conversation, Message
from memory.agent.report import AgentRun
from memory.agent.rules import MEMO_IMPORTANCE, attributed, rule_for, sentences
from memory.agent.standing import Standing, standing_statements
from memory.archival import Embedding, archival_embed, archival_insert
from memory.facts import looks_secret
from memory.models import DEFAULT_CHAR_LIMIT, Actor, CoreMemoryBlock
from memory.services import core_memory_write
from tenants.errors import ApplicationError
from tenants.models import EndUser

logger = logging.getLogger(__name__)


def _append_core(
    end_user: EndUser, label: str, line: str, *, conversation: Conversation, trigger: str
) -> bool:
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


def _line_key(line: str) -> str:
    """A core memory line compared without its #seq, case, punctuation or spacing."""
    return " ".join(re.sub(r"[\W_]+", " ", re.sub(r"^#\d+\s+", "", line.strip()).lower()).split())


def _line_tag(line: str) -> str:
    """How a trigger names a line: its #seq, or else its start."""
    seq = re.match(r"#\d+\b", line)
    return seq.group(0) if seq else repr(line[:30])


def _core_line_add(
    end_user: EndUser, label: str, line: str, *, conversation: Conversation, trigger: str
) -> dict[str, Any] | None:
    """Append `line` to a block unless the block already says it (_line_key). When the block would pass
    its char_limit, its oldest lines give way, never the new one, and the trigger says which. Returns the
    run's operation, or None when nothing changed. Inside the batch's transaction: the block is locked."""
    block = CoreMemoryBlock.objects.select_for_update().filter(end_user=end_user, label=label).first()
    lines = [old for old in (block.value.split("\n") if block else []) if old.strip()]
    if _line_key(line) in {_line_key(old) for old in lines}:
        return None
    limit = block.char_limit if block else DEFAULT_CHAR_LIMIT
    if len(line) > limit:  # only a block made smaller than one line: the line keeps its start
        line = line[: limit - 1] + "…"
    dropped = []
    while lines and len("\n".join([*lines, line])) > limit:
        dropped.append(lines.pop(0))
    if dropped:
        tags = ", ".join(_line_tag(old) for old in dropped)
        trigger += (
            f"; block over its {limit}-character limit: the oldest {len(dropped)} line(s) gave way ({tags})"
        )
    try:
        core_memory_write(
            end_user=end_user,
            label=label,
            value="\n".join([*lines, line]) if dropped else None,
            append=None if dropped else line,
            expected_version=block.version if block else None,
            actor=Actor.AGENT,
            actor_name="rules",
            trigger=trigger,
            conversation=conversation,
        )
    except ApplicationError as exc:
        logger.info("memory agent skipped core memory %s: %s", label, exc.message)
        return None
    operation: dict[str, Any] = {
        "op": "core_memory_update" if dropped else "core_memory_append",
        "label": label,
    }
    return {**operation, "dropped": dropped} if dropped else operation


def _standing_store(
    run: AgentRun, end_user: EndUser, conversation: Conversation, message: Message, item: Standing
) -> None:
    """One line "#<seq> <the user's words>" in the `instructions` or `preferences` block."""
    if looks_secret(item.text):
        return  # the sentence rules note it
    rule = "instruction" if item.label == "instructions" else "preference"
    line = f"#{message.seq} {attributed(message, item.text)}"
    trigger = f"rule:{rule} (message #{message.seq})"
    operation = _core_line_add(end_user, item.label, line, conversation=conversation, trigger=trigger)
    if operation is not None:
        if operation.get("dropped"):
            run.notes.append(
                f"Core memory <{item.label}> was full: its oldest {len(operation['dropped'])} line(s) gave "
                f"way to the one from message #{message.seq}."
            )
        run.operations.append({**operation, "rule": rule})


def rules_apply(
    run: AgentRun,
    end_user: EndUser,
    conversation: Conversation,
    message: Message,
    embeddings: dict[str, Embedding],
) -> None:
    """The rules over one user message, sentence by sentence; a standing instruction or preference goes to
    core memory once (a short message that is one is kept whole), where its first sentence comes."""
    standing = {s: item for item in standing_statements(message.content) for s in item.sentences}
    stored: list[Standing] = []
    for sentence in sentences(message.content):
        item = standing.get(sentence)
        if item is not None and item not in stored:
            stored.append(item)
            _standing_store(run, end_user, conversation, message, item)
        _sentence_apply(run, end_user, conversation, message, sentence, embeddings)


def rules_embed(messages: list[Message]) -> dict[str, Embedding]:
    """The vectors of the archival memories the rules will insert for a batch's user messages, computed
    before the run locks the cursor (as it does for the LLM's plan): the lock is held only to write."""
    contents = {
        attributed(message, rule.content)
        for message in messages
        if message.role == Message.Role.USER
        for sentence in sentences(message.content)
        if (rule := rule_for(sentence)) is not None and rule.kind is not None
    }
    return {content: archival_embed(content) for content in sorted(contents)}


def _sentence_apply(
    run: AgentRun,
    end_user: EndUser,
    conversation: Conversation,
    message: Message,
    sentence: str,
    embeddings: dict[str, Embedding],
) -> None:
    rule = rule_for(sentence)
    if rule is None:
        return
    if rule.secret:
        run.notes.append(f"A sentence of message #{message.seq} reads as a secret: not remembered.")
        return
    trigger = f"rule:{rule.rule} (message #{message.seq})"
    if rule.rule == "name":
        if _append_core(end_user, "profile", rule.content, conversation=conversation, trigger=trigger):
            run.operations.append({"op": "core_memory_append", "label": "profile", "rule": rule.rule})
        return
    if rule.kind is None:
        return
    content = attributed(message, rule.content)
    outcome = archival_insert(
        end_user=end_user,
        content=content,
        kind=rule.kind,
        importance=MEMO_IMPORTANCE if rule.memo else 0.5,
        conversation=conversation,
        source_message_ids=[str(message.id)],
        actor=Actor.AGENT,
        actor_name="rules",
        trigger=trigger,
        embedding=embeddings.get(content),  # a miss is embedded here, as before
    )
    operation: dict[str, Any] = {
        "op": f"archival_memory_{outcome.action}",
        "id": str(outcome.memory.id),
        "rule": rule.rule,
    }
    if outcome.invalidated:
        operation["invalidated"] = [str(m.id) for m in outcome.invalidated]
    run.operations.append(operation)
