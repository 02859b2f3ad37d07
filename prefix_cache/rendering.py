"""Deterministic rendering of the B1–B6 layout into a provider's request shape.

The same Layout always renders to the same bytes: nothing here reads the clock, a request id or any
per-request state. The system message is B1 + B2a + B4; the messages are B6 (rendered from stored content
only) followed by the current user message, which carries the per-request blocks (B5, B3, B2b, memory
updates, attachments) in a fixed order ahead of the user's own words.
"""

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

FORMATS = ("openai", "anthropic", "gemini")

SECTION_TITLES = {
    "B2a": "## Core memory",
    "B4": "## Conversation summary",
    "B5": "## Retrieved context",
    "B3": "## Task state",
    "B2b": "## Session profile",
    "memory_updates": "## Memory updates",
    "attachments": "## Attachments and tool output",
    "question": "## User question",
}
# Order of the per-request sections inside the current user message.
USER_SECTIONS = ("B5", "B3", "B2b", "memory_updates", "attachments")


@dataclass(frozen=True)
class Item:
    """One piece of a block, with its token count and where it came from."""

    text: str
    tokens: int
    source: dict[str, Any]
    score: float = 0.0


@dataclass(frozen=True)
class HistoryMessage:
    id: str
    seq: int
    role: str
    content: str
    parts: list[dict[str, Any]]
    token_count: int
    is_error: bool = False
    completed: bool = True


@dataclass
class Layout:
    b1: Item | None = None
    b2a: list[Item] = field(default_factory=list)
    b4: list[Item] = field(default_factory=list)
    b6: list[HistoryMessage] = field(default_factory=list)
    b5: list[Item] = field(default_factory=list)
    b3: Item | None = None
    b2b: Item | None = None
    memory_updates: list[Item] = field(default_factory=list)
    attachments: list[Item] = field(default_factory=list)
    user_message: str = ""


def canonical_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _section(key: str, items: list[Item]) -> str:
    if not items:
        return ""
    return SECTION_TITLES[key] + "\n" + "\n\n".join(item.text for item in items)


# --- text of the two composite messages -------------------------------------------------------------------


def system_sections(layout: Layout) -> list[str]:
    """[B1, B2a, B4] section texts ('' where a block is absent); joined they are the system message."""
    return [layout.b1.text if layout.b1 else "", _section("B2a", layout.b2a), _section("B4", layout.b4)]


def join_sections(sections: list[str]) -> str:
    return "\n\n".join(s for s in sections if s)


def system_text(layout: Layout) -> str:
    return join_sections(system_sections(layout))


def user_sections(layout: Layout) -> dict[str, str]:
    blocks: dict[str, list[Item]] = {
        "B5": layout.b5,
        "B3": [layout.b3] if layout.b3 else [],
        "B2b": [layout.b2b] if layout.b2b else [],
        "memory_updates": layout.memory_updates,
        "attachments": layout.attachments,
    }
    return {key: _section(key, blocks[key]) for key in USER_SECTIONS if blocks[key]}


def current_user_text(layout: Layout) -> str:
    """The user's question, preceded by the per-request sections when there are any. With none, the
    message is exactly what the user wrote."""
    sections = user_sections(layout)
    if not sections:
        return layout.user_message
    return join_sections([*sections.values(), SECTION_TITLES["question"] + "\n" + layout.user_message])


# --- history ----------------------------------------------------------------------------------------------


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else canonical_json(arguments)


def _arguments_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return {"raw": arguments}
    return arguments


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")


def _image_text(part: dict[str, Any]) -> str:
    # Pixels are attached by the visual-memory stage; until then an image is named, not invented.
    return f"[Image: {part['image_id']}]"


def _text_of(message: HistoryMessage) -> str:
    """Content plus image references, for roles whose parts cannot carry structure."""
    images = [_image_text(p) for p in message.parts if p["type"] == "image"]
    return "\n".join([message.content, *images]) if images else message.content


def _openai_history(message: HistoryMessage) -> list[dict[str, Any]]:
    calls = [p for p in message.parts if p["type"] == "tool_call"]
    results = [p for p in message.parts if p["type"] == "tool_result"]
    if message.role == "assistant" and calls:
        return [
            {
                "role": "assistant",
                "content": message.content or None,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": _arguments_text(c["arguments"])},
                    }
                    for c in calls
                ],
            }
        ]
    if message.role == "tool" and results:
        return [
            {"role": "tool", "tool_call_id": r["tool_call_id"], "content": _result_text(r["content"])}
            for r in results
        ]
    role = message.role if message.role in ("system", "user", "assistant") else "user"
    return [{"role": role, "content": _text_of(message)}]


def _anthropic_history(message: HistoryMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.role == "tool":
        for r in (p for p in message.parts if p["type"] == "tool_result"):
            block = {
                "type": "tool_result",
                "tool_use_id": r["tool_call_id"],
                "content": _result_text(r["content"]),
            }
            if r.get("is_error") or message.is_error:
                block["is_error"] = True
            blocks.append(block)
        if not blocks:
            blocks.append({"type": "text", "text": message.content})
        return [{"role": "user", "content": blocks}]
    text = _text_of(message)
    if message.role == "system":
        # Anthropic has no system turns inside the conversation.
        text = f"[system] {text}"
    if text:
        blocks.append({"type": "text", "text": text})
    for c in (p for p in message.parts if p["type"] == "tool_call"):
        blocks.append(
            {"type": "tool_use", "id": c["id"], "name": c["name"], "input": _arguments_object(c["arguments"])}
        )
    if not blocks:
        blocks.append({"type": "text", "text": ""})
    return [{"role": "assistant" if message.role == "assistant" else "user", "content": blocks}]


def _gemini_history(message: HistoryMessage, tool_names: dict[str, str]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if message.role == "tool":
        for r in (p for p in message.parts if p["type"] == "tool_result"):
            name = r.get("name") or tool_names.get(r["tool_call_id"], "tool")
            parts.append(
                {"functionResponse": {"name": name, "response": {"content": _result_text(r["content"])}}}
            )
        if not parts:
            parts.append({"text": message.content})
        return [{"role": "user", "parts": parts}]
    text = _text_of(message)
    if message.role == "system":
        text = f"[system] {text}"
    if text:
        parts.append({"text": text})
    for c in (p for p in message.parts if p["type"] == "tool_call"):
        parts.append({"functionCall": {"name": c["name"], "args": _arguments_object(c["arguments"])}})
    if not parts:
        parts.append({"text": ""})
    return [{"role": "model" if message.role == "assistant" else "user", "parts": parts}]


def render_history(history: list[HistoryMessage], fmt: str) -> list[dict[str, Any]]:
    rendered: list[dict[str, Any]] = []
    tool_names: dict[str, str] = {}
    for message in history:
        if fmt == "openai":
            rendered += _openai_history(message)
        elif fmt == "anthropic":
            rendered += _anthropic_history(message)
        else:
            for c in (p for p in message.parts if p["type"] == "tool_call"):
                tool_names[c["id"]] = c["name"]
            rendered += _gemini_history(message, tool_names)
    return rendered


# --- whole request ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    system: Any
    messages: list[dict[str, Any]]
    system_text: str
    history: list[dict[str, Any]]
    user_text: str


def render(layout: Layout, fmt: str) -> Rendered:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    system = system_text(layout)
    history = render_history(layout.b6, fmt)
    user = current_user_text(layout)
    if fmt == "openai":
        messages = ([{"role": "system", "content": system}] if system else []) + history
        messages.append({"role": "user", "content": user})
        return Rendered(system=system, messages=messages, system_text=system, history=history, user_text=user)
    if fmt == "anthropic":
        # Breakpoints after the system message and after the last history message: both prefixes stay
        # byte-identical until the next compaction, so each turn reads them from the cache.
        system_blocks = (
            [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}] if system else []
        )
        messages = list(history)
        if messages:
            # Copy only what changes, so `history` (hashed for the prefix) stays without the marker.
            last = messages[-1]
            blocks = [*last["content"][:-1], {**last["content"][-1], "cache_control": {"type": "ephemeral"}}]
            messages[-1] = {**last, "content": blocks}
        messages.append({"role": "user", "content": [{"type": "text", "text": user}]})
        return Rendered(
            system=system_blocks, messages=messages, system_text=system, history=history, user_text=user
        )
    system_instruction = {"parts": [{"text": system}]} if system else None
    messages = [*history, {"role": "user", "parts": [{"text": user}]}]
    return Rendered(
        system=system_instruction, messages=messages, system_text=system, history=history, user_text=user
    )
