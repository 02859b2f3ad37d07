"""Prompts as token sequences the way a provider's cache sees them, and the common prefix of two of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Stand-ins for the special tokens of the chat format (they are not text, so they never merge with it).
START, SEPARATOR, END = -1, -2, -3


class PromptTokenizer:
    """Tokens of an OpenAI-format prompt, one tuple per message, memoised by the message's bytes."""

    def __init__(self, encode: Callable[[str], list[int]], canonical: Callable[[Any], str]) -> None:
        self.encode = encode
        self.canonical = canonical
        self.memo: dict[str, tuple[int, ...]] = {}

    def message(self, message: dict[str, Any]) -> tuple[int, ...]:
        key = self.canonical(message)
        tokens = self.memo.get(key)
        if tokens is None:
            texts = [message.get("content") or ""]
            # A tool call counts as name(arguments), as Mnemo counts it when the message is stored: OpenAI
            # does not document how it serialises tool calls, and the ids never differ between two turns.
            texts += [
                f"{c['function']['name']}({c['function']['arguments']})"
                for c in message.get("tool_calls", [])
            ]
            body = [token for text in texts for token in self.encode(text)]
            tokens = (START, *self.encode(message["role"]), SEPARATOR, *body, END)
            self.memo[key] = tokens
        return tokens

    def prompt(self, messages: list[dict[str, Any]]) -> list[tuple[int, ...]]:
        return [self.message(m) for m in messages]


def common_prefix(a: list[tuple[int, ...]], b: list[tuple[int, ...]]) -> int:
    """Length in tokens of the longest common prefix of two tokenised prompts."""
    total = 0
    for x, y in zip(a, b, strict=False):
        if x == y:
            total += len(x)
            continue
        for p, q in zip(x, y, strict=False):
            if p != q:
                break
            total += 1
        break
    return total
