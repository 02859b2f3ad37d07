"""The context call's response body: the prompt ready to send, and how it was made (blocks with their tokens,
hashes and provenance, what the budget dropped, the prefix hints, timings and degradations)."""

from typing import Any

from context.state import ContextState
from prefix_cache.accounting import count_cached
from prefix_cache.rendering import canonical_json, sha256, system_sections, user_sections


def _block(
    text: str, *, model: str, items: list[dict[str, Any]], tokens: int | None = None
) -> dict[str, Any]:
    return {
        "tokens": tokens if tokens is not None else count_cached(text, model=model),
        "sha256": sha256(text),
        "items": items,
    }


def context_payload(state: ContextState) -> dict[str, Any]:
    """The response body: the prompt ready to send, and how it was made."""

    assert state.rendered is not None
    layout = state.layout
    b1_text, b2a_text, b4_text = system_sections(layout)
    blocks: dict[str, Any] = {}
    if layout.b1:
        blocks["B1"] = _block(b1_text, model=state.model, items=[layout.b1.source])
    if layout.b2a:
        blocks["B2a"] = _block(
            b2a_text, model=state.model, items=[{**i.source, "tokens": i.tokens} for i in layout.b2a]
        )
    if layout.b4:
        blocks["B4"] = _block(
            b4_text, model=state.model, items=[{**i.source, "tokens": i.tokens} for i in layout.b4]
        )
    if layout.b6:
        blocks["B6"] = {
            **_block(
                state.history_json or canonical_json(state.rendered.history),
                model=state.model,
                items=[
                    {"kind": "message", "id": m.id, "seq": m.seq, "tokens": m.token_count} for m in layout.b6
                ],
                tokens=state.tokens["history"],
            ),
            "from_seq": layout.b6[0].seq,
            "to_seq": layout.b6[-1].seq,
        }
    per_request = {
        "B5": layout.b5,
        "B3": [layout.b3] if layout.b3 else [],
        "B2b": [layout.b2b] if layout.b2b else [],
        "memory_updates": layout.memory_updates,
        "attachments": layout.attachments,
    }
    sections = user_sections(layout)
    for key, items in per_request.items():
        if items:
            blocks[key] = _block(
                sections[key], model=state.model, items=[{**i.source, "tokens": i.tokens} for i in items]
            )
    blocks["user"] = {"tokens": state.tokens["user"], "sha256": sha256(state.rendered.user_text), "items": []}
    return {
        "context_id": state.context_id,
        "model": state.model,
        "format": state.fmt,
        "system": state.rendered.system,
        "messages": state.rendered.messages,
        "token_budget": state.budget,
        "tokens": {**state.tokens, "exact": state.info.exact_tokens},
        "blocks": blocks,
        "dropped": state.dropped,
        "prefix": state.prefix,
        "window": {"boundary_seq": state.boundary_seq, "window_start_seq": state.context.window_start_seq},
        "timings": state.timings,
        "degradations": state.degradations,
    }
