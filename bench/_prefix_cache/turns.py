"""Per-turn figures of a run: prompt tokens, the share cached from the previous prompt, whether the
prefix moved."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench._prefix_cache.tokens import PromptTokenizer, common_prefix

FIRST_STEADY_TURN = 3  # 0-based: in turns 1-3 the prompt is still near the 1,024-token minimum of any cache


@dataclass
class TurnStat:
    prompt_tokens: int
    prefix_tokens: int  # common token prefix with the previous turn's prompt
    cached: int  # of which OpenAI would serve from its cache
    previous_tokens: int  # the previous turn's prompt
    event: str  # what reset the prefix at this turn ("" for nothing)
    predicted: int | None = None  # Mnemo's own prediction (prefix.predicted_cached_tokens)

    @property
    def moved(self) -> bool:
        return bool(self.event)

    @property
    def share(self) -> float:
        return self.cached / self.prompt_tokens

    @property
    def reused(self) -> float:
        """How much of the previous prompt this one starts with: 100 % means the layout lost nothing, and
        the uncached rest is only what the provider never saw (the reply, tool output, the new question)."""
        return self.prefix_tokens / self.previous_tokens if self.previous_tokens else 0.0


def turn_stats(
    prompts: list[list[dict[str, Any]]],
    events: list[str],
    tokenizer: PromptTokenizer,
    cacheable: Callable[[int], int],
    predicted: list[int] | None = None,
) -> list[TurnStat]:
    stats = []
    previous: list[tuple[int, ...]] | None = None
    for t, prompt in enumerate(prompts):
        tokens = tokenizer.prompt(prompt)
        size = sum(map(len, tokens))
        prefix = common_prefix(previous, tokens) if previous is not None else 0
        before = sum(map(len, previous)) if previous is not None else 0
        stats.append(
            TurnStat(
                prompt_tokens=size,
                prefix_tokens=prefix,
                cached=cacheable(prefix),
                previous_tokens=before,
                event=events[t],
                predicted=predicted[t] if predicted else None,
            )
        )
        previous = tokens
    return stats
