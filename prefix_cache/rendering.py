"""Deterministic rendering of the B1–B6 layout into a provider's request shape.

The same Layout always renders to the same bytes: nothing here reads the clock, a request id or any
per-request state. The system message is B1 + B2a + B4; the messages are B6 (rendered from stored content
only) followed by the current user message, which carries the per-request blocks (B5, B3, B2b, memory
updates, attachments) in a fixed order ahead of the user's own words.
"""

import hashlib
import json
from _json import make_encoder
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from conversations.parts import UNAVAILABLE, image_line
from prefix_cache.provenance import (
    AgentProfileSource,
    AttachmentSource,
    CoreMemorySource,
    ItemSource,
    MemoryUpdateSource,
    RetrievedSource,
    SessionProfileSource,
    SummarySegmentSource,
    TaskStateSource,
)

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


S = TypeVar("S", bound=ItemSource, covariant=True)


@dataclass(frozen=True)
class Item(Generic[S]):
    """One piece of a block, with its token count and where it came from (prefix_cache/provenance.py)."""

    text: str
    tokens: int
    source: S
    score: float = 0.0

    def data(self) -> dict[str, Any]:
        """Its entry in the response's `items`: its source and its tokens."""
        return {**self.source.data(), "tokens": self.tokens}


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
    # image_id -> (media_type, base64) of the images whose pixels the prompt may carry, handed over by the
    # context pipeline (context/images.py) so that rendering stays a pure function of what it is given.
    images: Mapping[str, tuple[str, str]] = field(default_factory=dict, compare=False)


@dataclass
class Layout:
    """The blocks of one prompt, named for what they hold; the B-codes (DESIGN.md, Layout) name them in the
    API, the docs and the prefix levels."""

    agent: Item[AgentProfileSource] | None = None  # B1: the agent profile's role and policy
    core_memory: list[Item[CoreMemorySource]] = field(default_factory=list)  # B2a
    summaries: list[Item[SummarySegmentSource]] = field(default_factory=list)  # B4
    history: list[HistoryMessage] = field(default_factory=list)  # B6
    retrieved: list[Item[RetrievedSource]] = field(default_factory=list)  # B5
    task_state: Item[TaskStateSource] | None = None  # B3
    session_profile: Item[SessionProfileSource] | None = None  # B2b
    memory_updates: list[Item[MemoryUpdateSource]] = field(default_factory=list)
    attachments: list[Item[AttachmentSource]] = field(default_factory=list)
    user_message: str = ""


# One encoder for every call: json.dumps with options builds a new one each time, and the hint stage encodes
# each history message (thousands at a 128k window).
_CANONICAL = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))


# The C encoder JSONEncoder.encode builds on every call (json.encoder.c_make_encoder, imported from _json,
# which CPython always has), built once: what encode() does for a value that is not a string, without its
# per-call set-up (the hint stage encodes every history message). No circular-reference check: the values
# are rendered messages and parsed JSON, which cannot hold a cycle.
_CANONICAL_C = make_encoder(
    None,
    _CANONICAL.default,
    json.encoder.encode_basestring,
    None,
    _CANONICAL.key_separator,
    _CANONICAL.item_separator,
    True,  # sort_keys
    False,  # skipkeys
    True,  # allow_nan
)


def canonical_json(value: Any) -> str:
    if isinstance(value, str):
        return _CANONICAL.encode(value)
    return "".join(_CANONICAL_C(value, 0))


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _section(key: str, items: Sequence[Item[ItemSource]]) -> str:
    if not items:
        return ""
    return SECTION_TITLES[key] + "\n" + "\n\n".join(item.text for item in items)


# --- text of the two composite messages -------------------------------------------------------------------


def system_sections(layout: Layout) -> list[str]:
    """[B1, B2a, B4] section texts ('' where a block is absent); joined they are the system message."""
    return [
        layout.agent.text if layout.agent else "",
        _section("B2a", layout.core_memory),
        _section("B4", layout.summaries),
    ]


def join_sections(sections: list[str]) -> str:
    return "\n\n".join(s for s in sections if s)


def system_text(layout: Layout) -> str:
    return join_sections(system_sections(layout))


def user_sections(layout: Layout) -> dict[str, str]:
    blocks: dict[str, Sequence[Item[ItemSource]]] = {
        "B5": layout.retrieved,
        "B3": [layout.task_state] if layout.task_state else [],
        "B2b": [layout.session_profile] if layout.session_profile else [],
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


# --- images -----------------------------------------------------------------------------------------------
# An image part renders as real pixels when the pipeline handed its bytes over (message.images) and it is
# neither a duplicate nor compacted; otherwise as one line of text. Formats differ only in the block shape.

Pixels = tuple[str, str, str]  # (media_type, base64, detail)


def _image_view(part: dict[str, Any], images: Mapping[str, tuple[str, str]]) -> str | Pixels:
    line = image_line(part)
    if line is not None:
        return line
    payload = images.get(part["image_id"])
    if payload is None:
        return UNAVAILABLE.format(image_id=part["image_id"])
    return (payload[0], payload[1], part.get("detail", "auto"))


def _views(
    parts: list[dict[str, Any]], images: Mapping[str, tuple[str, str]]
) -> tuple[list[str], list[Pixels]]:
    """(lines, pixel images) of the image parts at this level, in order."""
    lines: list[str] = []
    pixels: list[Pixels] = []
    for part in parts:
        if part.get("type") == "image":
            view = _image_view(part, images)
            (lines if isinstance(view, str) else pixels).append(view)  # type: ignore[arg-type]
    return lines, pixels


def _with_lines(text: str, lines: list[str]) -> str:
    return "\n".join([text, *lines]) if lines else text


def _result_views(result: dict[str, Any], images: Mapping[str, tuple[str, str]]) -> tuple[str, list[Pixels]]:
    """A tool result's text (with the lines of its images) and the pixels its content carries."""
    content = result["content"]
    if isinstance(content, str):
        return content, []
    lines, pixels = _views(content, images)
    return _with_lines(_result_text(content), lines), pixels


def _openai_image(pixels: Pixels) -> dict[str, Any]:
    media_type, data, detail = pixels
    return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}", "detail": detail}}


def _anthropic_image(pixels: Pixels) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": pixels[0], "data": pixels[1]}}


def _gemini_image(pixels: Pixels) -> dict[str, Any]:
    return {"inlineData": {"mimeType": pixels[0], "data": pixels[1]}}


def _text_of(message: HistoryMessage) -> str:
    """Content plus the lines of images shown as text, for roles whose parts cannot carry structure."""
    lines, _ = _views(message.parts, message.images)
    return _with_lines(message.content, lines)


def _openai_history(message: HistoryMessage) -> list[dict[str, Any]]:
    if not message.parts:
        # What the general case below renders for a message without parts (most of a long history).
        role = message.role if message.role in ("system", "user", "assistant") else "user"
        return [{"role": role, "content": message.content}] if message.content else []
    calls = [p for p in message.parts if p["type"] == "tool_call"]
    results = [p for p in message.parts if p["type"] == "tool_result"]
    lines, pixels = _views(message.parts, message.images)
    rendered: list[dict[str, Any]]
    if message.role == "assistant" and calls:
        rendered = [
            {
                "role": "assistant",
                "content": _with_lines(message.content, lines) or None,
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
    elif message.role == "tool" and results:
        rendered = []
        carried: list[Pixels] = []
        for r in results:
            text, nested = _result_views(r, message.images)
            rendered.append({"role": "tool", "tool_call_id": r["tool_call_id"], "content": text})
            carried += nested
        pixels = carried + pixels
        if lines:
            rendered[-1]["content"] = _with_lines(rendered[-1]["content"], lines)
    else:
        role = message.role if message.role in ("system", "user", "assistant") else "user"
        text = _with_lines(message.content, lines)
        if role == "user" and pixels:
            blocks = [{"type": "text", "text": text}] if text else []
            return [{"role": "user", "content": blocks + [_openai_image(p) for p in pixels]}]
        rendered = [{"role": role, "content": text}] if text else []
    if pixels:
        # Only user messages carry images in Chat Completions: the pixels follow in one.
        rendered.append({"role": "user", "content": [_openai_image(p) for p in pixels]})
    return rendered


def _anthropic_history(message: HistoryMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    lines, pixels = _views(message.parts, message.images)
    if message.role == "tool":
        for r in (p for p in message.parts if p["type"] == "tool_result"):
            text, nested = _result_views(r, message.images)
            content: Any = text
            if nested:
                content = ([{"type": "text", "text": text}] if text else []) + [
                    _anthropic_image(p) for p in nested
                ]
            block = {"type": "tool_result", "tool_use_id": r["tool_call_id"], "content": content}
            if r.get("is_error") or message.is_error:
                block["is_error"] = True
            blocks.append(block)
        if not blocks:
            blocks.append({"type": "text", "text": message.content})
        if lines:
            blocks.append({"type": "text", "text": "\n".join(lines)})
        blocks += [_anthropic_image(p) for p in pixels]
        return [{"role": "user", "content": blocks}]
    text = _with_lines(message.content, lines)
    if message.role == "system":
        # Anthropic has no system turns inside the conversation.
        text = f"[system] {text}"
    if text:
        blocks.append({"type": "text", "text": text})
    for c in (p for p in message.parts if p["type"] == "tool_call"):
        blocks.append(
            {"type": "tool_use", "id": c["id"], "name": c["name"], "input": _arguments_object(c["arguments"])}
        )
    if message.role != "assistant":
        blocks += [_anthropic_image(p) for p in pixels]
    if not blocks:
        # An empty message (a streamed reply cut off before its first token) says nothing, and Anthropic
        # refuses empty text blocks: leave it out.
        return []
    rendered = [{"role": "assistant" if message.role == "assistant" else "user", "content": blocks}]
    if message.role == "assistant" and pixels:
        # An assistant turn cannot hold images: they follow in a user turn.
        rendered.append({"role": "user", "content": [_anthropic_image(p) for p in pixels]})
    return rendered


def _gemini_history(message: HistoryMessage, tool_names: dict[str, str]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    lines, pixels = _views(message.parts, message.images)
    if message.role == "tool":
        for r in (p for p in message.parts if p["type"] == "tool_result"):
            name = r.get("name") or tool_names.get(r["tool_call_id"], "tool")
            text, nested = _result_views(r, message.images)
            parts.append({"functionResponse": {"name": name, "response": {"content": text}}})
            pixels = pixels + nested
        if not parts:
            parts.append({"text": message.content})
        if lines:
            parts.append({"text": "\n".join(lines)})
        parts += [_gemini_image(p) for p in pixels]
        return [{"role": "user", "parts": parts}]
    text = _with_lines(message.content, lines)
    if message.role == "system":
        text = f"[system] {text}"
    if text:
        parts.append({"text": text})
    for c in (p for p in message.parts if p["type"] == "tool_call"):
        parts.append({"functionCall": {"name": c["name"], "args": _arguments_object(c["arguments"])}})
    parts += [_gemini_image(p) for p in pixels]
    if not parts:
        return []  # see _anthropic_history: an empty message is left out
    return [{"role": "model" if message.role == "assistant" else "user", "parts": parts}]


def render_history_groups(history: list[HistoryMessage], fmt: str) -> list[list[dict[str, Any]]]:
    """The provider messages of each stored message (one stored message may render as several, or none)."""
    groups: list[list[dict[str, Any]]] = []
    tool_names: dict[str, str] = {}
    for message in history:
        if fmt == "openai":
            groups.append(_openai_history(message))
        elif fmt == "anthropic":
            groups.append(_anthropic_history(message))
        else:
            for c in (p for p in message.parts if p["type"] == "tool_call"):
                tool_names[c["id"]] = c["name"]
            groups.append(_gemini_history(message, tool_names))
    return groups


def render_history(history: list[HistoryMessage], fmt: str) -> list[dict[str, Any]]:
    return [entry for group in render_history_groups(history, fmt) for entry in group]


# --- whole request ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    system: Any
    messages: list[dict[str, Any]]
    system_text: str
    history: list[dict[str, Any]]
    user_text: str
    # Per stored history message, its provider messages (for the prefix hash chain), and the current
    # message as sent (None when blank).
    history_groups: list[list[dict[str, Any]]] = field(default_factory=list)
    current: dict[str, Any] | None = None


def render(layout: Layout, fmt: str) -> Rendered:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    system = system_text(layout)
    groups = render_history_groups(layout.history, fmt)
    history = [entry for group in groups for entry in group]
    user = current_user_text(layout)
    # A blank current message (an agent loop going on after a tool result) is not sent as an empty turn.
    if fmt == "openai":
        messages = ([{"role": "system", "content": system}] if system else []) + history
        if user:
            messages.append({"role": "user", "content": user})
        return Rendered(
            system=system,
            messages=messages,
            system_text=system,
            history=history,
            user_text=user,
            history_groups=groups,
            current=messages[-1] if user else None,
        )
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
        if user:
            messages.append({"role": "user", "content": [{"type": "text", "text": user}]})
        return Rendered(
            system=system_blocks,
            messages=messages,
            system_text=system,
            history=history,
            user_text=user,
            history_groups=groups,
            current=messages[-1] if user else None,
        )
    system_instruction = {"parts": [{"text": system}]} if system else None
    messages = [*history, {"role": "user", "parts": [{"text": user}]}] if user else list(history)
    return Rendered(
        system=system_instruction,
        messages=messages,
        system_text=system,
        history=history,
        user_text=user,
        history_groups=groups,
        current=messages[-1] if user else None,
    )
