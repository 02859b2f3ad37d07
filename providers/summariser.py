"""The offline extractive summariser and the fact extractor behind the summary fact check.

Deterministic: the same messages and target always give the same text (ties are broken by position, no
randomness, no clock). Sentences are scored on one additive scale by term weight (tf·isf over the segment,
with the frequency capped so repeated boilerplate does not drown what was said once), position (a message's
opening, the segment's first and last messages), cue words by category (decisions first, then errors and
fixes, open tasks, intent), explicit requests and the named things they carry (numbers, identifiers, paths,
names, dates), weighted by role (the user's words most, tool output least); near-duplicates of an already
chosen sentence are skipped. The chosen
sentences are printed verbatim in their original order, so numbers and identifiers are never paraphrased.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from providers.text import (
    FILE_EXTENSION_PATTERN,
    MONTHS,
    SUMMARY_STOPWORDS,
    URL_TAIL,
    WEEKDAYS,
    summary_sentences,
)
from providers.tokens import count_text

VERSION = "extractive-v1"

# --- facts ------------------------------------------------------------------------------------------------

_MONTHS = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?"
    r"|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_UNITS = (
    r"(?:ms|µs|us|ns|s|sec|secs|seconds?|min|mins|minutes?|h|hrs?|hours?|days?|weeks?|months?|years?|"
    r"[KMGTP]i?B|[kmg]b|bytes?|px|pt|em|rem|k|K|M|bn|million|billion|thousand|tokens?|rps|qps|req/s|"
    r"USD|EUR|GBP|CHF|JPY|CNY|dollars?|euros?|percent|°C|°F|kg|g|mg|km|m|cm|mm|mi|ft|cores?|vCPUs?|"
    r"GHz|MHz|users?|requests?|rows?|items?|messages?|retries|replicas?|workers?|nodes?|pods?)"
)

# (kind, priority, pattern). Order matters: each match masks its span, so a later, more general pattern
# (a bare number) never re-reads part of an earlier, more specific one (a date, a path, a version).
_FACT_PATTERNS: list[tuple[str, int, re.Pattern[str]]] = [
    ("url", 5, re.compile(rf"\bhttps?://{URL_TAIL}")),
    ("path", 5, re.compile(r"(?<![\w/])[A-Za-z]:\\(?:[\w .-]+\\)*[\w .-]*\w")),
    (
        "path",
        5,
        re.compile(
            r"(?<![\w@])(?:~|\.{1,2})?/?(?:[\w.@+-]+/)+[\w.@+-]*\w"
            r"(?=$|[\s,;:!?)\]'\"`]|\.(?:\s|$))"
        ),
    ),
    ("path", 4, re.compile(rf"(?<![\w/.-])[\w-]+(?:\.[\w-]+)*\.{FILE_EXTENSION_PATTERN}\b", re.IGNORECASE)),
    ("date", 4, re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?(?:Z|[+-]\d{2}:?\d{2})?)?\b")),
    ("date", 4, re.compile(rf"\b{_MONTHS}\.? \d{{1,2}}(?:st|nd|rd|th)?(?:,? \d{{4}})?\b")),
    ("date", 4, re.compile(rf"\b\d{{1,2}}(?:st|nd|rd|th)? {_MONTHS}(?:,? \d{{4}})?\b")),
    ("date", 4, re.compile(r"\b\d{1,2}/\d{1,2}/\d{2,4}\b")),
    ("date", 3, re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[ap]\.?m\.?)?(?![\d:])", re.IGNORECASE)),
    ("quoted", 4, re.compile(r"`([^`\n]{2,80})`")),
    ("quoted", 4, re.compile(r"\"([^\"\n]{2,60})\"|“([^”\n]{2,60})”|(?<!\w)'([^'\n]{2,60})'(?!\w)")),
    ("identifier", 3, re.compile(r"\b[A-Z][A-Z0-9]+-\d+\b")),  # ticket ids: PROJ-1234
    ("number", 3, re.compile(r"[$€£¥]\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:k|K|m|M|bn|million|billion))?")),
    ("number", 3, re.compile(r"\bv?\d+\.\d+\.\d+(?:[-+][\w.]+)?\b|\bv\d+(?:\.\d+)?\b")),  # versions
    ("number", 3, re.compile(rf"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:%|{_UNITS}\b)")),
    ("identifier", 3, re.compile(r"\b[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+\(\)|\b\w+\(\)")),
    ("identifier", 3, re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b")),  # snake_case, CONSTANTS
    ("identifier", 3, re.compile(r"\b[a-z]+(?:[A-Z][a-z0-9]+)+\b")),  # camelCase
    ("identifier", 3, re.compile(r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+\b")),  # PascalCase
    ("identifier", 2, re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,64}\b")),  # hashes
    (
        "number",
        2,
        re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\w|\.\w)|(?<![\w.])\d+\.\d+(?!\w|\.\w)"),
    ),
    ("number", 2, re.compile(r"(?<![\w.#])\d{2,}(?!\w|\.\w)")),
    (
        "name",
        4,
        re.compile(r"\b[A-Z][a-z]+(?:[ -](?:[A-Z][a-z]+|van|von|de|da|del|di|le|la))*[ -][A-Z][a-z]+\b"),
    ),
]
# A capitalised word inside a sentence (not its first word) names something: a person, product, place.
_CAPITALISED = re.compile(r"(?<=[a-z0-9,;:)] )[A-Z][a-zA-Z0-9]+(?:[+#]{1,2})?\b")
_COMMON_CAPITALISED = frozenset(
    [
        "I",
        "I'm",
        "I've",
        "I'd",
        "I'll",
        "OK",
        "Ok",
        "Okay",
        "Yes",
        "No",
        "Thanks",
        "Thank",
        "Please",
        "Sure",
        "Also",
        "Then",
        "Hi",
        "Hello",
        "Hey",
        "Note",
        *WEEKDAYS,
        *MONTHS,
        "The",
        "A",
        "An",
        "This",
        "That",
        "These",
        "Those",
        "It",
        "If",
        "When",
        "What",
        "Why",
        "How",
        "Which",
        "Who",
        "Where",
        "We",
        "You",
        "He",
        "She",
        "They",
        "My",
        "Our",
        "Your",
        "Their",
        "His",
        "Her",
        "Its",
        "Let",
        "So",
        "But",
        "And",
        "Or",
        "Not",
        "Do",
        "Does",
        "Did",
        "Can",
        "Could",
        "Would",
        "Should",
        "Will",
        "Here",
        "There",
        "Now",
        "Just",
        "Good",
        "Great",
        "Done",
        "Step",
        "First",
        "Second",
        "Third",
        "Next",
        "Finally",
        "User",
        "Assistant",
        "Tool",
        "System",
    ]
)

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_'-]*[A-Za-z0-9]|[A-Za-z]")


@dataclass(frozen=True)
class Fact:
    text: str  # as written in the transcript
    kind: str  # url, path, date, quoted, identifier, number, name
    priority: int  # 5 (paths) .. 1 (a lone capitalised word)
    count: int  # occurrences in the text it was extracted from
    first: int  # position of the first occurrence
    context: str  # the fact with the words that led up to it, for numbers and dates


def _norm(text: str) -> str:
    text = text.lower().replace("\u2019", "'")
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)


def _mask(text: str, start: int, end: int) -> str:
    return text[:start] + " " * (end - start) + text[end:]


def extract_facts(text: str, *, min_priority: int = 1) -> list[Fact]:
    """The named things of a text (numbers with units, versions, money, identifiers, paths and URLs, quoted
    names, proper names, dates), de-duplicated (case and thousands separators ignored), in order of first
    appearance."""
    found: dict[str, list] = {}
    masked = text
    for kind, priority, pattern in _FACT_PATTERNS:
        if priority < min_priority:
            continue
        for match in pattern.finditer(masked):
            value = next((g for g in match.groups() if g), None) if match.groups() else None
            value = (value or match.group(0)).strip()
            start = match.start()
            if kind == "name":
                value, start = _trim_name(value, start)
            if len(value) < 2 or not _plausible(kind, value):
                continue
            _record(found, value, kind, priority, start, text)
            masked = _mask(masked, match.start(), match.end())
    if min_priority <= 1:
        for match in _CAPITALISED.finditer(masked):
            word = match.group(0)
            if word in _COMMON_CAPITALISED or len(word) < 3 or (word.isupper() and len(word) <= 5):
                continue
            _record(found, word, "name", 1, match.start(), text)
    facts = [
        Fact(text=v[0], kind=v[1], priority=v[2], count=v[3], first=v[4], context=v[5])
        for v in found.values()
    ]
    facts.sort(key=lambda f: f.first)
    return facts


# Capitalised only because they open a sentence: "Ask Priya Raman" names Priya Raman.
_LEADING_WORDS = frozenset(
    [
        "ask",
        "tell",
        "call",
        "send",
        "check",
        "see",
        "use",
        "run",
        "add",
        "let",
        "make",
        "take",
        "meet",
        "email",
        "contact",
        "ping",
        "thank",
        "dear",
        "please",
        "also",
        "then",
        "when",
        "if",
        "so",
        "and",
        "but",
        "maybe",
        "sure",
        "yes",
        "no",
        "ok",
        "okay",
        "hi",
        "hello",
        "hey",
        "thanks",
    ]
)


def _trim_name(value: str, start: int) -> tuple[str, int]:
    words = value.split(" ")
    while words and (
        words[0] in _COMMON_CAPITALISED
        or words[0].lower() in _LEADING_WORDS
        or words[0].lower() in SUMMARY_STOPWORDS
    ):
        start += len(words[0]) + 1
        words = words[1:]
    if len(words) < 2:
        return "", start  # one word left: the single-word rule below decides
    return " ".join(words), start


def _plausible(kind: str, value: str) -> bool:
    if kind != "path" or value[0] in "/~." or "\\" in value:
        return True
    # A relative path needs two slashes or a file extension: "and/or", "I/O", "24/7" are not paths.
    parts = value.split("/")
    if all(p.isdigit() for p in parts if p):
        return False
    return len(parts) > 2 or "." in parts[-1]


def _record(found: dict[str, list], value: str, kind: str, priority: int, position: int, text: str) -> None:
    key = _norm(value)
    entry = found.get(key)
    if entry is not None:
        entry[3] += 1
        entry[4] = min(entry[4], position)
        return
    context = value
    if kind in ("number", "date"):
        # "port 8443" says more than "8443": keep up to three words that lead up to a bare number or date.
        lead = re.split(r"[.!?;]\s|\n", text[max(0, position - 50) : position])[-1]
        words = [w.strip("()[]{},:\"'") for w in lead.split()[-3:]]
        words = [w for w in words if w]
        if words:
            context = " ".join(words) + " " + value
    found[key] = [value, kind, priority, 1, position, context]


def fact_present(fact: Fact, text_norm: str) -> bool:
    """Whether `text_norm` (a text passed through normalise()) still states the fact."""
    return _norm(fact.text) in text_norm


def normalise(text: str) -> str:
    return _norm(text)


# --- sentences ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceMessage:
    """One message to summarise: its seq, role, and the text the model saw."""

    seq: int
    role: str
    text: str
    label: str = ""  # e.g. a tool's name, shown as "Tool (name)"
    name: str = ""  # the speaker the client named, shown instead of the role


@dataclass
class _Sentence:
    index: int  # global order
    message: int  # index of its message
    text: str
    terms: list[str]
    facts: int
    first_in_message: bool
    score: float = 0.0


# Cue words by what the summary must keep (DESIGN: requests and intent, decisions, errors and fixes, open
# tasks). A sentence scores the strongest category it shows, plus a little for each further cue word.
_CUE_CATEGORIES: tuple[tuple[float, frozenset[str]], ...] = (
    (
        1.2,  # decisions
        frozenset(
            [
                "decided",
                "decide",
                "decision",
                "decisions",
                "agreed",
                "agree",
                "chose",
                "choose",
                "chosen",
                "settled",
                "approved",
                "rejected",
                "confirmed",
                "final",
                "instead",
                "prefer",
                "prefers",
                "preferred",
                "concluded",
            ]
        ),
    ),
    (
        0.8,  # errors and their fixes
        frozenset(
            [
                "error",
                "errors",
                "failed",
                "fails",
                "failure",
                "failing",
                "exception",
                "bug",
                "crash",
                "crashed",
                "broken",
                "fix",
                "fixed",
                "fixes",
                "resolved",
                "workaround",
                "cause",
                "root",
                "traceback",
                "timeout",
                "regression",
                "outage",
            ]
        ),
    ),
    (
        0.6,  # open tasks and constraints
        frozenset(
            [
                "todo",
                "remaining",
                "pending",
                "deadline",
                "must",
                "blocked",
                "blocker",
                "promised",
                "owe",
                "follow-up",
                "next",
                "later",
                "important",
                "required",
                "requirement",
                "never",
                "always",
            ]
        ),
    ),
    (
        0.5,
        frozenset(["want", "wants", "need", "needs", "goal", "remember", "asked", "request", "requested"]),
    ),  # intent
)
_REQUEST = re.compile(r"(?i)^(?:\W*)(?:can|could|would|will) you\b|\bplease\b|\bi (?:want|need|would like)\b")

_ROLE_WEIGHT = {"user": 1.1, "system": 1.0, "assistant": 1.0, "tool": 0.7}
_ROLE_LABEL = {"user": "User", "assistant": "Assistant", "system": "System", "tool": "Tool"}


def _terms(sentence: str) -> list[str]:
    words = (t.lower() for t in _WORD.findall(sentence))
    return [w for w in words if w not in SUMMARY_STOPWORDS and len(w) > 1]


def _default_counter() -> Callable[[str], int]:
    return lambda text: count_text(text, encoding="o200k_base")


def summarise(
    messages: Sequence[SourceMessage],
    *,
    target_tokens: int,
    count_tokens: Callable[[str], int] | None = None,
    focus: str = "",
) -> str:
    """An extractive summary of `messages` of at most about `target_tokens` tokens: the best sentences,
    verbatim, in their original order, each line led by who said it. `focus` (e.g. an operator's
    instructions) raises sentences that share its terms."""
    count = count_tokens or _default_counter()
    sentences = _sentences(messages)
    if not sentences:
        return ""
    _score(sentences, messages, focus)
    chosen = _select(sentences, target_tokens=target_tokens, count=count, messages=messages)
    return _render(chosen, messages)


def _sentences(messages: Sequence[SourceMessage]) -> list[_Sentence]:
    out: list[_Sentence] = []
    for m_index, message in enumerate(messages):
        for s_index, text in enumerate(summary_sentences(message.text)):
            out.append(
                _Sentence(
                    index=len(out),
                    message=m_index,
                    text=text,
                    terms=_terms(text),
                    facts=len(extract_facts(text, min_priority=2)),
                    first_in_message=s_index == 0,
                )
            )
    return out


def _score(sentences: list[_Sentence], messages: Sequence[SourceMessage], focus: str) -> None:
    """Each signal on one scale, added: the term weight (normalised to 0..1 over the segment), position,
    cue category, named things, an explicit request, the focus; then weighted by role."""
    n = len(sentences)
    frequency: Counter[str] = Counter()
    spread: Counter[str] = Counter()
    for s in sentences:
        frequency.update(s.terms)
        spread.update(set(s.terms))
    focus_terms = set(_terms(focus))
    last_message = len(messages) - 1

    def weight(term: str) -> float:
        # tf·isf with the frequency capped: a topic the segment returns to counts, boilerplate repeated in
        # every other sentence does not drown what was said once.
        return min(2.0, math.log1p(frequency[term])) * math.log(1 + n / spread[term])

    raw = [sum(weight(t) for t in set(s.terms)) / len(set(s.terms)) if s.terms else 0.0 for s in sentences]
    top = max(raw, default=0.0) or 1.0
    for s, term_score in zip(sentences, raw, strict=True):
        distinct = set(s.terms)
        if not distinct:
            s.score = 0.0
            continue
        # Very short sentences ("Good.", "Thanks a lot.") carry little whatever their words.
        score = term_score / top * min(1.0, len(distinct) / 4)
        if s.first_in_message:
            score += 0.15
        if s.message == 0 or s.message == last_message:
            score += 0.15
        strengths = [w for w, words in _CUE_CATEGORIES if distinct & words]
        if strengths:
            score += max(strengths) + 0.1 * (len(strengths) - 1)
        score += 0.3 * min(s.facts, 3)
        if _REQUEST.search(s.text):
            score += 0.3
        if focus_terms and distinct & focus_terms:
            score += 0.8 * len(distinct & focus_terms)
        s.score = score * _ROLE_WEIGHT.get(messages[s.message].role, 1.0)


def _similar(a: _Sentence, b: _Sentence) -> bool:
    x, y = set(a.terms), set(b.terms)
    if not x or not y:
        return a.text == b.text
    return len(x & y) / len(x | y) > 0.6


def _select(
    sentences: list[_Sentence],
    *,
    target_tokens: int,
    count: Callable[[str], int],
    messages: Sequence[SourceMessage],
) -> list[_Sentence]:
    ranked = sorted(sentences, key=lambda s: (-s.score, s.index))
    chosen: list[_Sentence] = []
    used = 0
    # Each new message line costs its role label; a sentence joining a chosen message's line does not.
    label_cost = 3
    lines: set[int] = set()
    for s in ranked:
        if s.score <= 0:
            break
        if any(_similar(s, c) for c in chosen):
            continue
        cost = count(s.text) + 1 + (0 if s.message in lines else label_cost)
        if used + cost > target_tokens:
            if used >= target_tokens * 0.9:
                break
            continue  # a shorter sentence further down may still fit
        chosen.append(s)
        lines.add(s.message)
        used += cost
    if not chosen and sentences:
        # Even a target smaller than any sentence gets the best one, shortened.
        best = ranked[0]
        words = best.text.split()
        keep = max(5, int(target_tokens * 0.7))
        chosen = [
            _Sentence(
                best.index,
                best.message,
                " ".join(words[:keep]) + (" …" if len(words) > keep else ""),
                best.terms,
                best.facts,
                best.first_in_message,
            )
        ]
    chosen.sort(key=lambda s: s.index)
    return chosen


def _render(chosen: Iterable[_Sentence], messages: Sequence[SourceMessage]) -> str:
    lines: list[str] = []
    current = -1
    for s in chosen:
        if s.message != current:
            message = messages[s.message]
            label = message.name or _ROLE_LABEL.get(message.role, message.role.title())
            if message.label:
                label = f"{label} ({message.label})"
            lines.append(f"- {label}: {s.text}")
            current = s.message
        else:
            lines[-1] += " " + s.text
    return "\n".join(lines)
