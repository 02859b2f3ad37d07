"""The blocks of the context call's response: each block the prompt carries with its tokens, the hash of its
rendered text and the provenance of its items (context/serializers.py renders the rest of the body)."""

from collections.abc import Sequence
from typing import Any

from context.state import ContextState
from prefix_cache.accounting import count_cached
from prefix_cache.provenance import ItemSource
from prefix_cache.rendering import Item, canonical_json, sha256, system_sections, user_sections


def _block(
    text: str, *, model: str, items: list[dict[str, Any]], tokens: int | None = None
) -> dict[str, Any]:
    return {
        "tokens": tokens if tokens is not None else count_cached(text, model=model),
        "sha256": sha256(text),
        "items": items,
    }


def context_blocks(state: ContextState) -> dict[str, Any]:
    """The response's blocks, in the order the prompt carries them (those present): the system message's
    B1, B2a and B4, the history B6, the current message's sections, and the user's own text."""
    assert state.rendered is not None
    blocks = {**_system_blocks(state), **_history_block(state), **_request_blocks(state)}
    blocks["user"] = {"tokens": state.tokens["user"], "sha256": sha256(state.rendered.user_text), "items": []}
    return blocks


def _system_blocks(state: ContextState) -> dict[str, Any]:
    layout, blocks = state.layout, {}
    b1_text, b2a_text, b4_text = system_sections(layout)
    if layout.agent:
        blocks["B1"] = _block(b1_text, model=state.model, items=[layout.agent.source.data()])
    if layout.core_memory:
        blocks["B2a"] = _block(b2a_text, model=state.model, items=[i.data() for i in layout.core_memory])
    if layout.summaries:
        blocks["B4"] = _block(b4_text, model=state.model, items=[i.data() for i in layout.summaries])
    return blocks


def _history_block(state: ContextState) -> dict[str, Any]:
    """B6 with its seq range; its text is the history's JSON the hint stage serialised for the hashes."""
    assert state.rendered is not None
    messages = state.layout.history
    if not messages:
        return {}
    block = _block(
        state.history_json or canonical_json(state.rendered.history),
        model=state.model,
        items=[{"kind": "message", "id": m.id, "seq": m.seq, "tokens": m.token_count} for m in messages],
        tokens=state.tokens["history"],
    )
    return {"B6": {**block, "from_seq": messages[0].seq, "to_seq": messages[-1].seq}}


def _request_blocks(state: ContextState) -> dict[str, Any]:
    layout, blocks = state.layout, {}
    per_request: dict[str, Sequence[Item[ItemSource]]] = {
        "B5": layout.retrieved,
        "B3": [layout.task_state] if layout.task_state else [],
        "B2b": [layout.session_profile] if layout.session_profile else [],
        "memory_updates": layout.memory_updates,
        "attachments": layout.attachments,
    }
    sections = user_sections(layout)
    for key, items in per_request.items():
        if items:
            blocks[key] = _block(sections[key], model=state.model, items=[i.data() for i in items])
    return blocks
