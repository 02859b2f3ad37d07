"""The memory agent's LLM tools: their definitions, and each call checked against a copy of the core memory
blocks and planned as a write (applied by memory.agent.run once the model is done).

Tools (Letta-like: core memory is edited by text, not by position):
- core_memory_append(label, content): adds `content` as a new line at the end of the block.
- core_memory_update(label, old_text, new_text): replaces `old_text`, which must occur exactly once in the
  block, with `new_text`; an empty `new_text` deletes it.
- archival_memory_insert(content, kind): stores a fact or episode (near-duplicates merge; a newer fact about
  the same subject invalidates the older one, see memory.archival).
- archival_memory_search(query): hybrid search; the hits go back to the model as the tool result.
The writable labels are those shown to the model: the user's blocks plus `preferences` and `profile`
(created on first write). Each tool takes an optional `source_seq`, the #seq of the message the memory comes
from; it goes into the trigger and the archival memory's source ids. An unknown tool or label, arguments that
are not JSON and a value over the limit go back to the model as tool errors, so it can correct itself."""

import json
from dataclasses import dataclass, field
from typing import Any

from conversations.models import Conversation, Message
from memory.agent.batch import Batch
from memory.agent.report import AgentRun, degrade
from memory.archival import Embedding, archival_search
from memory.models import DEFAULT_CHAR_LIMIT, ArchivalMemory, CoreMemoryBlock
from memory.selectors import label_order
from providers.llm import ToolCall
from tenants.models import EndUser

# Tool calls per batch, the size of one archival memory, and the hits a search shows the model.
MAX_TOOL_CALLS = 24
ARCHIVAL_CONTENT_CHARS = 1_000
SEARCH_HITS = 5
# Labels the model may create; other labels must already exist (custom blocks are made by the API/admin).
CREATABLE_LABELS = ("preferences", "instructions", "profile")


@dataclass
class Block:
    """The model's copy of one core memory block: its calls are checked against it."""

    label: str
    value: str
    char_limit: int
    version: int  # 0: the block does not exist yet


def blocks_read(end_user: EndUser) -> dict[str, Block]:
    blocks = {
        b.label: Block(b.label, b.value, b.char_limit, b.version)
        for b in CoreMemoryBlock.objects.filter(end_user=end_user)
    }
    for label in CREATABLE_LABELS:
        blocks.setdefault(label, Block(label, "", DEFAULT_CHAR_LIMIT, 0))
    return dict(sorted(blocks.items(), key=lambda item: label_order(item[0])))


def tool_definitions(labels: list[str]) -> list[dict[str, Any]]:
    """The four tools as OpenAI function tools; `label` is limited to the blocks the model was shown."""
    source_seq = {"type": "integer", "description": "The #seq of the message this memory comes from."}
    label = {"type": "string", "enum": labels, "description": "The core memory block."}

    def tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {"type": "object", "properties": properties, "required": required},
            },
        }

    return [
        tool(
            "core_memory_append",
            "Add a line at the end of a core memory block.",
            {"label": label, "content": {"type": "string"}, "source_seq": source_seq},
            ["label", "content"],
        ),
        tool(
            "core_memory_update",
            "Replace text in a core memory block: old_text must occur exactly once in the block and is "
            "replaced by new_text (an empty new_text deletes it).",
            {
                "label": label,
                "old_text": {"type": "string"},
                "new_text": {"type": "string"},
                "source_seq": source_seq,
            },
            ["label", "old_text", "new_text"],
        ),
        tool(
            "archival_memory_insert",
            "Store one self-contained fact, decision, outcome or piece of context in archival memory.",
            {
                "content": {"type": "string"},
                "kind": {"type": "string", "enum": list(ArchivalMemory.Kind.values)},
                "source_seq": source_seq,
            },
            ["content", "kind"],
        ),
        tool(
            "archival_memory_search",
            "Search archival memory; returns the best matching memories.",
            {"query": {"type": "string"}},
            ["query"],
        ),
    ]


TOOL_NAMES = ("core_memory_append", "core_memory_update", "archival_memory_insert", "archival_memory_search")


class Refused(Exception):
    """A tool call that cannot be carried out; goes back to the model as the tool result."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Write:
    tool: str
    call_id: str
    trigger: str
    source_ids: list[str]
    label: str = ""
    value: str = ""  # core: the block's whole new value
    append: str = ""  # core_memory_append: the line added
    expected_version: int = 0  # core: the version the model saw (0: create)
    content: str = ""
    kind: str = ""
    embedding: Embedding | None = None  # archival: computed before the cursor's lock is taken


@dataclass
class Plan:
    """What the LLM decided for one batch; applied only after the model is done."""

    model: str
    writes: list[Write] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0


@dataclass
class LoopState:
    end_user: EndUser
    batch: Batch
    blocks: dict[str, Block]
    plan: Plan
    run: AgentRun
    conversation: Conversation


def _string_arg(args: dict[str, Any], name: str, *, strip: bool = True) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise Refused("bad_arguments", f"{name!r} must be a string.")
    if not value.strip():
        raise Refused("bad_arguments", f"{name!r} must not be empty.")
    return value.strip() if strip else value


def _provenance(state: LoopState, tool: str, args: dict[str, Any]) -> tuple[str, list[str]]:
    """The trigger and source message ids: the named message when it is in the batch, else the batch."""
    seq = args.get("source_seq")
    by_seq = {m.seq: m for m in state.batch.messages}
    if isinstance(seq, int) and not isinstance(seq, bool) and seq in by_seq:
        return f"llm:{tool} (message #{seq})", [str(by_seq[seq].id)]
    first, last = state.batch.messages[0].seq, state.batch.messages[-1].seq
    users = [str(m.id) for m in state.batch.messages if m.role == Message.Role.USER]
    return f"llm:{tool} (messages #{first}-#{last})", users


def _block_for(state: LoopState, args: dict[str, Any]) -> Block:
    label = _string_arg(args, "label")
    block = state.blocks.get(label)
    if block is None:
        raise Refused(
            "unknown_label", f"No core memory block {label!r}; the blocks are: {', '.join(state.blocks)}."
        )
    return block


def _check_fits(block: Block, value: str) -> None:
    if len(value) > block.char_limit:
        raise Refused(
            "over_char_limit",
            f"Block {block.label!r} would have {len(value)} characters; its limit is {block.char_limit}. "
            "Shorten the text or replace older content with core_memory_update.",
        )


def tool_run(state: LoopState, call: ToolCall) -> dict[str, Any]:
    """Check one call against the copy of the blocks and plan its write (a search runs at once). Returns the
    tool result for the model; raises Refused for an invalid call."""
    args = _call_arguments(state, call)
    if call.name == "archival_memory_search":
        return _search_tool(state, args)
    trigger, source_ids = _provenance(state, call.name, args)
    if call.name == "archival_memory_insert":
        content, kind = _insert_arguments(args)
        state.plan.writes.append(Write(call.name, call.id, trigger, source_ids, content=content, kind=kind))
        return {"ok": True, "stored": content}
    block = _block_for(state, args)
    if call.name == "core_memory_append":
        line = _string_arg(args, "content")
        if line.lower() in block.value.lower():
            return {"ok": True, "unchanged": True, "note": f"Block {block.label!r} already says this."}
        value = f"{block.value}\n{line}" if block.value else line
    else:
        line, value = "", _replaced_value(block, args)
        if value == block.value:
            return {"ok": True, "unchanged": True}
    _check_fits(block, value)
    state.plan.writes.append(
        Write(
            call.name,
            call.id,
            trigger,
            source_ids,
            label=block.label,
            value=value,
            append=line,
            expected_version=block.version,
        )
    )
    # The copy moves on, so the next call on this block sees this edit (and its version is the next one).
    block.value = value
    block.version += 1
    return {"ok": True, "label": block.label, "chars": len(value), "char_limit": block.char_limit}


def _call_arguments(state: LoopState, call: ToolCall) -> dict[str, Any]:
    """The arguments of a call that is within the run's limit and names a known tool."""
    state.plan.calls += 1
    if state.plan.calls > MAX_TOOL_CALLS:
        raise Refused("too_many_calls", f"At most {MAX_TOOL_CALLS} tool calls per run.")
    if call.name not in TOOL_NAMES:
        raise Refused(
            "unknown_tool", f"There is no tool {call.name!r}; the tools are: {', '.join(TOOL_NAMES)}."
        )
    try:
        args = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as exc:
        raise Refused("bad_arguments", f"The arguments are not JSON: {exc.msg}.") from exc
    if not isinstance(args, dict):
        raise Refused("bad_arguments", "The arguments must be a JSON object.")
    return args


def _search_tool(state: LoopState, args: dict[str, Any]) -> dict[str, Any]:
    """archival_memory_search, run at once: the hits for the model (a degradation of the search is the
    run's)."""
    query = _string_arg(args, "query")
    outcome = archival_search(end_user=state.end_user, query=query, limit=SEARCH_HITS)
    for degradation in outcome.degradations:
        if degradation not in state.run.degradations:
            degrade(state.run, degradation["code"], degradation["message"], conversation=state.conversation)
    return {
        "results": [
            {
                "content": hit.memory.content,
                "kind": hit.memory.kind,
                "stored": hit.memory.created_at.date().isoformat(),
            }
            for hit in outcome.hits
        ]
    }


def _insert_arguments(args: dict[str, Any]) -> tuple[str, str]:
    """(content, kind) of an archival_memory_insert call."""
    content = _string_arg(args, "content")
    if len(content) > ARCHIVAL_CONTENT_CHARS:
        raise Refused("too_long", f"One memory holds at most {ARCHIVAL_CONTENT_CHARS} characters.")
    kind = args.get("kind", ArchivalMemory.Kind.FACT)
    if kind not in ArchivalMemory.Kind.values:
        raise Refused("bad_arguments", f"'kind' must be one of {', '.join(ArchivalMemory.Kind.values)}.")
    return content, kind


def _replaced_value(block: Block, args: dict[str, Any]) -> str:
    """The block's value after core_memory_update replaces old_text (which must occur exactly once) with
    new_text; an empty new_text deletes it, with its line break."""
    old_text = _string_arg(args, "old_text", strip=False)
    new_text = args.get("new_text", "")
    if not isinstance(new_text, str):
        raise Refused("bad_arguments", "'new_text' must be a string.")
    occurrences = block.value.count(old_text)
    if occurrences != 1:
        raise Refused(
            "old_text_not_found" if occurrences == 0 else "old_text_ambiguous",
            f"old_text occurs {occurrences} times in block {block.label!r}; it must occur exactly once "
            "(quote it exactly, with enough context).",
        )
    before, after = block.value.split(old_text, 1)
    if not new_text.strip():  # a deleted line takes its line break with it
        if before.endswith("\n") and (after.startswith("\n") or not after):
            before = before[:-1]
        elif not before and after.startswith("\n"):
            after = after[1:]
        new_text = ""
    return before + new_text + after
