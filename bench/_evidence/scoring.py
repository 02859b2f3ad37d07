"""Whether a prompt holds a message: word trigrams for long messages, a contiguous word run for short ones."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# A long message counts as present when this many of its trigrams are in the prompt (a verbatim passage).
MIN_TRIGRAM_HITS = 120


WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def trigrams(ws: list[str]) -> set[tuple[str, str, str]]:
    return {(ws[i], ws[i + 1], ws[i + 2]) for i in range(len(ws) - 2)}


def prompt_strings(response: dict[str, Any]) -> list[str]:
    """Every string a model would read: the system (text or text blocks) and each message's content."""
    out: list[str] = []

    def take(value: Any) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list):
            out.extend(p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))

    take(response.get("system"))
    for message in response.get("messages") or []:
        take(message.get("content"))
    return out


@dataclass
class Prompt:
    grams: set[tuple[str, str, str]]
    runs: str  # " w1 w2 ... " per string, strings separated by a newline so no run spans two

    @classmethod
    def of(cls, response: dict[str, Any]) -> Prompt:
        per_string = [words(s) for s in prompt_strings(response)]
        grams = set().union(*(trigrams(ws) for ws in per_string)) if per_string else set()
        return cls(grams, " " + " \n ".join(" ".join(ws) for ws in per_string) + " ")

    def holds(self, message_words: list[str]) -> bool:
        if len(message_words) < 3:
            return bool(message_words) and f" {' '.join(message_words)} " in self.runs
        grams = trigrams(message_words)
        hits = len(grams & self.grams)
        return 2 * hits >= len(grams) or hits >= MIN_TRIGRAM_HITS
