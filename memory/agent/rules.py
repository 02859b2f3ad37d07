"""The memory agent's rules: what they make of one sentence of a user's message, without the database, and
how what they keep says who said it.

The rules read the prose of the user's messages (code, logs and commands left out; lead-ins such as "btw" or
"note for later:" dropped). A standing instruction or a stated preference goes verbatim into core memory
(memory.agent.standing). The rules also keep "remember …", "my name is …", "we decided …", "my X is …", and a
durable detail stated in passing: a statement carrying a specific value (memory.facts), e.g. "the ledger
staging DB is on port 23456 now". A newer statement of the same detail invalidates the older memory
(memory.archival)."""

import re
from dataclasses import dataclass

from conversations.models import Message
from memory.agent.standing import STANDING_CHARS, excerpt, standing_kind, standing_match
from memory.facts import fact_signature, looks_secret, specific_values, strip_lead_in
from memory.models import ArchivalMemory
from providers.text import prose_sentences, without_end_mark

RULES: list[tuple[str, re.Pattern[str]]] = [
    ("remember", re.compile(r"^(?:please\s+)?remember(?:\s+that)?\s+(?P<fact>.{3,300})$", re.I)),
    ("name", re.compile(r"^(?:my name is|call me|i am called|i'm called)\s+(?P<name>[\w .'-]{2,60})$", re.I)),
    (
        "decision",
        re.compile(r"^(?:we decided|we agreed|decision:)\s*(?:to\s+|that\s+)?(?P<what>.{3,300})$", re.I),
    ),
    ("fact", re.compile(r"^(?:my|our)\s+[\w\s'-]{2,60}?\s+(?:is|are)\s+.{1,200}$", re.I)),
]
MEMO_IMPORTANCE = 0.6
# The "detail" rule: a statement of the user's that carries a specific value (memory.facts), e.g. "btw the
# ledger staging DB is on port 23456 now". Not a question, a request, a guess, code or a log line.
DETAIL_CHARS = (20, 300)
_QUESTION = re.compile(
    r"^(?:what|which|who|whom|whose|where|when|why|how|is|are|was|were|do|does|did|can|could|would|should|"
    r"will|shall|may|might|has|have|had|any idea|anyone|is there|are there)\b",
    re.I,
)
_REQUEST = re.compile(
    r"^(?:please|pls|plz|can you|could you|would you|will you|can we|could we|shall we|let's|let us|"
    r"i need you|i want you|i'd like you|help|tell|show|give|remind|make sure|try|check|run|fix|write|create|"
    r"explain|review|look|figure out|find|draft|summari[sz]e|send|don't|do not|never|go ahead)\b",
    re.I,
)
_HEDGE = re.compile(
    r"\b(?:think|thinks|thought|maybe|perhaps|probably|possibly|might|guess|wonder|wondering|not sure|unsure|"
    r"whether|suspect|seems?|apparently|assume|assuming|hopefully|i believe|not convinced|if)\b",
    re.I,
)
# What happened once or was measured, not a detail to keep: "the job failed twice", "roughly as slow".
_OBSERVATION = re.compile(
    r"\b(?:failed|fails|failing|crashed|crashes|broke|fired|spiked|errored|threw|flaked|hung|timed out|"
    r"went down|restarted|about \d|around \d|roughly|approximately|nearly \d|almost \d|"
    r"(?:higher|lower|faster|slower|more|less|bigger|smaller) than)\b|~\s?\d",
    re.I,
)
_STATEMENT = re.compile(
    r"\b(?:is|are|was|were|be|been|has|have|it's|lives?|sits?|runs?|on|at|to|into|in|under|through|via|"
    r"behind|called|named|pinned|moved|changed|switched|migrated|renamed|rotated|set|use|goes?|lands?|"
    r"took over|owned|owns|approved|opened|filed|merged|became|now|answers|listens|points?)\b|’s\b|'s\b|:\s",
    re.I,
)
_DECISION = re.compile(
    r"\b(?:we|the team)\s+(?:have\s+|'ve\s+|are\s+|'re\s+|will\s+|'ll\s+)?"
    r"(?:decided|agreed|chose|settled|pinned|gating|gated|froze|freezing|locked|standardi[sz]ed|committed)\b",
    re.I,
)


def sentences(text: str) -> list[str]:
    """The sentences of a message's prose, without their final full stop or exclamation mark."""
    return [without_end_mark(s) for s in prose_sentences(text)]


def _detail(sentence: str) -> str | None:
    """The archival kind when a sentence states a durable detail (see DETAIL_CHARS and the patterns above),
    else None."""
    if not DETAIL_CHARS[0] <= len(sentence) <= DETAIL_CHARS[1] or sentence.endswith("?"):
        return None
    if _QUESTION.match(sentence) or _REQUEST.match(sentence):
        return None
    if _HEDGE.search(sentence) or _OBSERVATION.search(sentence):
        return None
    values = specific_values(sentence)
    if not values or not _STATEMENT.search(sentence):
        return None
    # Besides the value, enough words to say what it belongs to ("it's QW-4821 now" does not).
    if len(fact_signature(sentence).words) < 2:
        return None
    return ArchivalMemory.Kind.DECISION if _DECISION.search(sentence) else ArchivalMemory.Kind.FACT


def attributed(message: Message, text: str) -> str:
    """What a rule keeps of a named speaker's message says who said it ("Priya: I moved to Lisbon"): in a
    conversation between several people, "I" alone would make it the end user's."""
    return f"{message.name}: {text}" if message.name else text


def _rule_match(sentence: str) -> tuple[str, re.Match[str] | None, str | None]:
    standing = standing_kind(sentence)
    if standing is not None:
        return ("instruction" if standing == "instructions" else "preference"), None, None
    for rule, pattern in RULES:
        match = pattern.match(sentence)
        if match is not None:
            return rule, match, None
    kind = _detail(sentence)
    return ("detail", None, kind) if kind else ("", None, None)


@dataclass(frozen=True)
class Rule:
    """What the rules make of one sentence, without the database: `rule` names the rule that matched; an
    archival memory of `kind` holds `content` (kind None: name and instruction go to core memory, a secret
    nowhere)."""

    rule: str
    content: str
    kind: str | None = None
    memo: bool = False  # said with "note for later", "fyi", "remember that": the user wants it kept
    secret: bool = False


def rule_for(sentence: str) -> Rule | None:
    sentence, memo = strip_lead_in(sentence)
    rule, match, kind = _rule_match(sentence)
    if not rule:
        return None
    if looks_secret(sentence):  # never stored, as the LLM is told too
        return Rule(rule, sentence, secret=True)
    if rule == "name":
        assert match is not None
        return Rule(rule, f"Name: {match.group('name').strip()}")
    if rule == "instruction":
        return Rule(rule, sentence)  # in core memory only (memory.agent.remember): in every prompt already
    content = _archival_excerpt(sentence, rule, match)
    if rule == "preference":  # its core memory line is written by memory.agent.remember
        kind = ArchivalMemory.Kind.PREFERENCE
    elif rule == "remember":
        assert match is not None
        kind, content, memo = ArchivalMemory.Kind.FACT, match.group("fact").strip(), True
    elif rule == "decision":
        kind = ArchivalMemory.Kind.DECISION
    elif rule == "fact":
        kind = ArchivalMemory.Kind.FACT
    return Rule(rule, content, kind or ArchivalMemory.Kind.FACT, memo)


def _archival_excerpt(sentence: str, rule: str, match: re.Match[str] | None) -> str:
    """What an archival memory keeps of a sentence: all of it, or of a long one (a request that runs on for
    hundreds of words) the words around what the rule matched, as core memory does (excerpt): a memory
    of a whole long request would take much of the share of the prompt that recalled memories have."""
    if len(sentence) <= STANDING_CHARS:
        return sentence
    start, end = 0, 0
    if rule == "preference":
        hit = standing_match(sentence)
        if hit is not None:
            start, end = hit[1], hit[2]
    elif match is not None:
        start, end = match.start(), match.end()
    return excerpt(sentence, start, end)
