"""The hint stage: the prompt's prefix levels (B1 … B1+B2a+B4+B6) and the hash chain of its history, what
the tenant sent before of them, and the cache the provider can be expected to serve."""

import functools
from typing import Any

from context.budget import system_message_tokens
from context.state import ContextState
from prefix_cache.rendering import canonical_json, sha256
from prefix_cache.rendering import system_sections as render_system_sections
from prefix_cache.services import PrefixLevel, cache_usage_open, prefix_hints_find, prefix_hints_record
from prefix_cache.usage import cacheable_tokens

LEVELS = ("B1", "B1+B2a", "B1+B2a+B4", "B1+B2a+B4+B6")


def prefix_hint(state: ContextState) -> None:
    levels, chain, prompt = _prefix_levels(state)
    tenant, seen = state.conversation.tenant, levels + ([prompt] if prompt else [])
    match = prefix_hints_find(tenant=tenant, levels=seen, chain=chain)
    hit = match.level if match.level != "prompt" else LEVELS[3]
    if match.chain_index is not None:
        # The system message and the history up to that message were sent before, byte for byte.
        cached_messages = match.chain_index + 1
        hit_tokens = levels[2].tokens + sum(m.token_count for m in state.layout.history[:cached_messages])
    else:
        cached_messages = 0
        hit_tokens = next((lv.tokens for lv in levels if lv.level == hit), 0)
    provider = {"openai": "openai", "anthropic": "anthropic", "gemini": "gemini"}[state.fmt]
    stable = levels[-1].tokens  # what the next request can re-use if nothing before the boundary changes
    predicted = cacheable_tokens(provider, prefix_tokens=hit_tokens, model=state.model)
    state.prefix = {
        "hashes": {lv.level: lv.hash for lv in levels},
        "tokens": {lv.level: lv.tokens for lv in levels},
        "hint_level": hit,
        "cached_history_messages": cached_messages,
        "predicted_cached_tokens": predicted,
        "cacheable_prefix_tokens": {
            p: cacheable_tokens(p, prefix_tokens=stable, model=state.model)
            for p in ("openai", "anthropic", "gemini")
        },
    }
    prediction = {"predicted_cacheable_tokens": predicted, "prefix_hash": levels[-1].hash, "hint_level": hit}
    state.records.append(functools.partial(prefix_hints_record, tenant=tenant, levels=seen, match=match))
    state.records.append(functools.partial(_usage_open, state, provider=provider, **prediction))


def _usage_open(state: ContextState, **prediction: Any) -> None:
    """The call's CacheUsage row, its prediction now and the provider's usage when reported; its id is the
    response's context_id (None in a call that records nothing)."""
    usage = cache_usage_open(
        conversation=state.conversation,
        model=state.model,
        predicted_prompt_tokens=state.tokens["total"],
        **prediction,
    )
    state.context_id = str(usage.id)


def _prefix_levels(state: ContextState) -> tuple[list[PrefixLevel], list[str], PrefixLevel | None]:
    """(the whole levels B1 … B1+B2a+B4+B6, the history hash chain, the whole prompt's level).

    The chain has one hash per stored history message, each over the one before and the system message,
    so a prompt that extends an earlier one (history grew, nothing before changed) finds the exact message
    up to which the earlier prompt was the same."""
    assert state.rendered is not None
    sections = render_system_sections(state.layout)
    salt = f"{state.fmt}\x00{state.model}\x00"
    levels = []
    for depth, level in enumerate(LEVELS[:3], start=1):
        text = "\n\n".join(s for s in sections[:depth] if s)
        tokens = system_message_tokens(text, model=state.model)
        levels.append(PrefixLevel(level, sha256(salt + text), tokens))
    chain: list[str] = []
    running = levels[-1].hash
    groups = [canonical_json(group) for group in state.rendered.history_groups]
    for group in groups:
        running = sha256(running + group)
        chain.append(running)
    # The whole history's JSON is its groups' entries in one list: the payload hashes it without a second
    # serialisation (thousands of messages at a large window).
    state.history_json = "[" + ",".join(group[1:-1] for group in groups if len(group) > 2) + "]"
    history_hash = chain[-1] if chain else sha256(levels[-1].hash + "[]")
    levels.append(PrefixLevel(LEVELS[3], history_hash, levels[-1].tokens + state.tokens["history"]))
    prompt = None
    if state.rendered.current is not None:
        # Recorded so that the next request, whose history ends with this question, matches through it.
        prompt = PrefixLevel(
            "prompt",
            sha256(history_hash + canonical_json([state.rendered.current])),
            levels[-1].tokens + state.tokens["user"],
        )
    return levels, chain, prompt
