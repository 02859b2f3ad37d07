"""Standing instructions and preferences: which of a user's sentences is one, and the user's words to keep.

A standing instruction ("Always format code with syntax highlighting when I ask about implementation
details", "Never use semicolons in my JS examples", "From now on answer in French") or a stated preference
("…, so I prefer simple, minimal dependencies, how can I …") is kept verbatim in core memory: the
`instructions` or the `preferences` block, one line per item, "#<seq> <the user's words>". Those blocks are
in every prompt, so precision comes before recall: a false line costs tokens in every later call. One-off
requests ("never mind", "don't worry", "can you always-on the server?") and questions are not orders."""

import re
from dataclasses import dataclass

from memory.facts import strip_lead_in
from providers.text import CODE_FENCE, prose_sentences, without_end_mark, wordset

# Verbs of orders given to an assistant. After an opening that is not itself an order ("from now on,",
# "whenever I paste a trace,"), only these count: "from now on, pytest runs in CI" is a statement.
_ORDER_VERBS = wordset(
    "add address answer annotate apply ask assume attach avoid be begin bold break call capitalise "
    "capitalize check cite comment compare confirm consider convert default define describe do document "
    "double-check draft emphasise emphasize end explain express favor favour flag focus follow format "
    "give go highlight include indent keep label lead leave limit link list maintain make mark mention "
    "name note number offer omit outline pin point prefer prefix present prioritise prioritize provide "
    "put quote recommend refer reference remind repeat reply respond return round show skip sort speak "
    "spell start state stay stick stop structure suggest summarise summarize switch talk tell test "
    "translate treat try type use walk warn wrap write"
)
# Words after "always"/"never" that make a statement or a one-off, not an order: "never mind", "always the
# same error", "never heard of it". Past, -ing and third-person forms are refused by their shape as well
# ("never tested it", "always learning", "always happens").
_NOT_ORDERS = wordset(
    "mind the a an this that these those it its there here i me my we our you your they he she them "
    "something nothing everything anything someone everyone nobody one been was were is are am has had did "
    "does gonna will would could can should so too very more less most same true fun good nice great easy "
    "hard enough again once before after when while if as like quite sure on in at of with without about "
    "for because got went came made saw thought knew felt found took ran said told kept left gave heard seen "
    "done gone broke fell forgot wrote became began brought bought caught taught meant lost being doing going"
)
# "Don't …" orders one task unless a scope makes it standing, and these never open an order.
_NOT_DONT = wordset(
    "worry bother mind forget know think understand get see have care want need remember like feel"
)
# Things one likes that are reactions to this moment, not preferences: "I love it", "I like the idea".
_NOT_LIKED = wordset(
    "it this that these those the your them him her you what how where which all both some any"
)
# The word before "I prefer" that makes it a question or a doubt: "should I prefer", "not sure if I prefer".
_ASKING = wordset(
    "do does did should would could can will shall might may if whether how what why where which who think "
    "guess assume wonder sure"
)
# What makes an order standing: a time ("from now on"), every answer ("in all your answers", "in my JS
# examples") or a request that recurs ("whenever I ask about …"; in front of the order, see the table).
_FROM_NOW = r"from now on|going forward|moving forward|henceforth|from here on(?: out)?|in future"
_STANDING_SCOPE = (
    rf"\b(?:{_FROM_NOW})\b|for the rest of (?:this|our|the) (?:conversation|chat|session)|"
    r"\bwhen(?:ever)? I (?:ask|request)\b|\b(?:every|each) time I (?:ask|request)\b|"
    r"\b(?:in|for) (?:(?:all|every|each|any) (?:of )?)?(?:your|my|future) (?:[\w-]+ )?"
    r"(?:answers|responses|replies|explanations|examples|snippets|suggestions|messages)\b|"
    r"\b(?:in|for) (?:all|every|each|any) (?:future )?(?:[\w-]+ )?"
    r"(?:answers?|responses?|repl(?:y|ies)|explanations?|examples?|snippets?|code)\b"
)
# Conjunctions and politeness in front of an order ("And please always …"); where a clause starts; adverbs
# between "always" and its verb ("never ever use", "always, always cite").
_OPEN = r"(?:(?:and|but|also|so|oh|ok|okay|please|kindly|just)\b[,\s]*)*"
_CLAUSE = r"(?:^|[,;:—–]\s*)"
_ADVERBS = r"(?:(?:ever|please|just|also|really|,)\s*)*"
# (block, pattern). A group named `order` must look like an imperative verb (see _ORDER_VERBS, _NOT_ORDERS),
# `verb` must be one of _ORDER_VERBS, `dont` must not be in _NOT_DONT, `liked` not in _NOT_LIKED; a
# preference led by "I" is refused after a word of _ASKING. An order ending in "?" is a question.
STANDING_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    # "Always format all code snippets …", "Never use semicolons …", "…, so please always cite the RFC"
    (
        "instructions",
        re.compile(rf"{_CLAUSE}{_OPEN}(?:always|never)\b[,\s]*{_ADVERBS}(?P<order>[\w'-]+)", re.I),
    ),
    # "Don't ever suggest jQuery", "Do not use semicolons in my JS examples", "Don't … from now on"
    ("instructions", re.compile(rf"^{_OPEN}(?:don'?t|do not) ever\s+(?P<order>[\w'-]+)", re.I)),
    (
        "instructions",
        re.compile(rf"^{_OPEN}(?:don'?t|do not) (?P<dont>[\w'-]+).*?(?:{_STANDING_SCOPE})", re.I),
    ),
    # "Make sure to always …", "be sure you never …", "remember to always …"
    (
        "instructions",
        re.compile(
            rf"^{_OPEN}(?:make sure|be sure|remember|try) (?:to|that you|you) (?:always|never)\b", re.I
        ),
    ),
    # "From now on answer in French", "Going forward, please use metric units"
    (
        "instructions",
        re.compile(
            rf"^{_OPEN}(?:{_FROM_NOW})\b[,\s]*{_OPEN}"
            r"(?:you (?:should|must|need to|have to|will)\b|(?:(?:always|never) )?(?P<verb>[\w'-]+))",
            re.I,
        ),
    ),
    # "Whenever I paste a trace, start with the root cause", "When I ask about deploys, always mention …"
    (
        "instructions",
        re.compile(
            rf"^{_OPEN}(?:when(?:ever)? I|(?:every|each) time I)\b[^,]{{3,150}},\s*{_OPEN}"
            r"(?:you (?:should|must|need to|have to)\b|(?:(?:always|never) )?(?P<verb>[\w'-]+))",
            re.I,
        ),
    ),
    # "Answer in French from now on", "Include version numbers whenever I ask about dependencies"
    ("instructions", re.compile(rf"^{_OPEN}(?P<verb>[\w'-]+)\b.*?(?:{_STANDING_SCOPE})", re.I)),
    # "You should always …", "I want you to never …", "Keep your answers short", "I want all your answers …"
    (
        "instructions",
        re.compile(
            rf"{_CLAUSE}{_OPEN}(?:you (?:should|must|need to|have to|shall)|"
            r"I (?:want|need|'d like|would like) you to) (?:always|never)\b",
            re.I,
        ),
    ),
    (
        "instructions",
        re.compile(rf"^{_OPEN}(?:keep|make) (?:all )?(?:of )?your (?:answers|responses|replies)\b", re.I),
    ),
    (
        "instructions",
        re.compile(
            r"\bI (?:want|need|'d like|would like) (?:all (?:of )?your|every|each of your) "
            r"(?:answers?|responses?|replies|reply|explanations?|code examples?)\b",
            re.I,
        ),
    ),
    # "I prefer …" anywhere ("…, so I prefer simple, minimal dependencies, how can I …"), "I'd prefer …",
    # "I usually prefer …", "I prioritize print editions …"; not "I prefer not to say"
    (
        "preferences",
        re.compile(
            r"\bI(?:'d| would)?(?: (?:really|generally|usually|always|also|still|strongly|much|definitely|"
            r"tend to|do))* (?:prefer|prioriti[sz]e)\b(?! not to (?:say|answer|share|disclose|discuss|talk))",
            re.I,
        ),
    ),
    # "I've always preferred tabs", "I'd rather you didn't …", "I'd rather use Excel than an app"
    ("preferences", re.compile(r"\bI(?:'ve| have) (?:always|long) (?:preferred|liked|loved|hated)\b", re.I)),
    (
        "preferences",
        re.compile(r"\bI(?:'d| would) rather (?:you\b|(?=.*\b(?:than|over|instead of)\b))", re.I),
    ),
    # "My preference is …", "considering my preference for keeping the bundle under 100KB"
    ("preferences", re.compile(r"\bmy (?:[\w-]+ )?preferences? (?:is|are|would be|for|towards?)\b", re.I)),
    # At a clause start: "I like it when you show the diff", "I hate long preambles", "…, but I enjoy print …"
    (
        "preferences",
        re.compile(
            rf"{_CLAUSE}(?:and |but |so )?I (?:(?:really|also|generally|usually|just|absolutely|do) )?"
            r"(?:like|love|hate|dislike|enjoy|can't stand|cannot stand|don't like|do not like) "
            r"(?P<liked>[\w'-]+)",
            re.I,
        ),
    ),
    # "I'm a big fan of …", "I'm not a fan of …"
    (
        "preferences",
        re.compile(r"\bI(?:'m| am) (?:not (?:really )?)?(?:a (?:big |huge )?fan of|partial to)\b", re.I),
    ),
]
# "What's my preference for …?", "do you remember my preference …": a question about one, not a statement.
_ASKED_PREFERENCE = re.compile(
    r"\b(?:what|which)(?:'s| is| are| was)? my\b|\b(?:remember|recall|forget|forgot|know) my\b", re.I
)
# An order may end with a tag ("…, okay?") and still be an order; any other "?" makes it a question.
_TAG_QUESTION = re.compile(r"[,\s](?:ok|okay|alright|please|got it|understood|thanks)\s*\?$", re.I)
# A sentence longer than this is kept as an excerpt: from the start of its clause to where the next clause
# (", and I've …") or a request (", can you …", ", how do I …") begins, so a preference said in passing in a
# long message costs its own words, not the whole message.
STANDING_CHARS = 300
_CLAUSE_TAIL = re.compile(
    r"[,;]\s+(?:(?:and|but|so|while|although|though|because|since|plus)\s+)?(?:also\s+)?"
    r"(?:can|could|would|will|how|what|which|where|why|do|does|is|are|should|any|maybe|considering|given|"
    r"please|provide|show|give|explain|tell|i|i'm|i've|i'd|i'll|we|we're|we've|my|it|it's|this|that)\b",
    re.I,
)


@dataclass(frozen=True)
class Standing:
    """A standing instruction or preference of the user's (see STANDING_PATTERNS)."""

    label: str  # the core memory block: instructions | preferences
    text: str  # the user's words: the sentence (an excerpt of a long one), or the whole short message
    sentences: tuple[str, ...]  # the sentences it covers, as memory.agent.rules.sentences gives them


def _looks_like_order(word: str, *, listed_only: bool) -> bool:
    lower = word.lower()
    if lower in _ORDER_VERBS:
        return True
    # A capitalised word is a name ("Always Alice …"), a word with an apostrophe a contraction ("never I'm").
    if listed_only or lower in _NOT_ORDERS or not re.fullmatch(r"[a-z][a-z-]*", word):
        return False
    if (lower.endswith("ing") and len(lower) > 5) or lower.endswith("ly"):
        return False
    if lower.endswith("ed") and not lower.endswith("eed"):
        return False
    return not (lower.endswith("s") and not lower.endswith(("ss", "us")))


# A sentence that opens like a question asks; it does not order ("can you always-on the server").
_ASKS = re.compile(
    r"(?:can|could|would|will|should|shall|may|might|did|does|is|are|was|were|has|have|had|what|why|how|"
    r"where|which|who|any idea)\b",
    re.I,
)


def _standing_holds(label: str, sentence: str, match: re.Match[str]) -> bool:
    """The checks a pattern of STANDING_PATTERNS leaves to code (see the comment above the table)."""
    groups = match.groupdict()
    if label == "instructions":
        if _ASKS.match(sentence) or (sentence.endswith("?") and not _TAG_QUESTION.search(sentence)):
            return False
        if groups.get("order") and not _looks_like_order(groups["order"], listed_only=False):
            return False
        if groups.get("verb") and not _looks_like_order(groups["verb"], listed_only=True):
            return False
        dont = groups.get("dont")
        return not dont or (dont.lower() not in _NOT_DONT and _looks_like_order(dont, listed_only=False))
    liked = groups.get("liked")
    # "I love it" is a reaction; "I love it when you …" a preference.
    if (
        liked
        and liked.lower() in _NOT_LIKED
        and not re.match(r"it (?:when|if)\b", sentence[match.start("liked") :], re.I)
    ):
        return False
    before = re.findall(r"[\w']+", sentence[: match.start()])
    if before and before[-1].lower() in _ASKING:
        return False
    return not _ASKED_PREFERENCE.search(sentence[max(0, match.start() - 25) : match.start() + 3])


def standing_match(sentence: str) -> tuple[str, int, int] | None:
    """(block, start, end) of the first standing instruction or preference in a sentence, else None."""
    for label, pattern in STANDING_PATTERNS:
        for match in pattern.finditer(sentence):
            if _standing_holds(label, sentence, match):
                return label, match.start(), match.end()
    return None


def standing_kind(sentence: str) -> str | None:
    """The core memory block ("instructions" or "preferences") for a standing instruction or preference."""
    hit = standing_match(strip_lead_in(sentence)[0])
    return hit[0] if hit else None


def excerpt(sentence: str, start: int, end: int) -> str:
    """The sentence, or for a long one (STANDING_CHARS) the words around [start, end): from the sentence's
    (or else the clause's) start to where a request or question begins. Cuts are marked with "…"."""
    if len(sentence) <= STANDING_CHARS:
        return sentence
    tail = _CLAUSE_TAIL.search(sentence, end)
    stop, begin = (tail.start() if tail else len(sentence)), 0
    if stop > STANDING_CHARS:
        clause = max(sentence.rfind(", ", 0, start), sentence.rfind("; ", 0, start))
        begin = clause + 2 if clause >= 0 else 0
    if stop - begin > STANDING_CHARS:
        space = sentence.rfind(" ", max(begin, end), begin + STANDING_CHARS)
        stop = space if space > 0 else begin + STANDING_CHARS
    text = sentence[begin:stop].strip(" ,;")
    return ("…" if begin else "") + text + (" …" if stop < len(sentence) else "")


def standing_statements(text: str) -> list[Standing]:
    """The standing instructions and preferences of a user message, in order (code, logs and quotes left
    out). A short one-line message (STANDING_CHARS) that is all instructions, or all preferences, is kept
    whole."""
    spans = prose_sentences(text)
    found = []
    for raw in spans:
        sentence = without_end_mark(raw)
        rest, _ = strip_lead_in(sentence)
        hit = standing_match(rest)
        if hit is not None:
            offset = len(sentence) - len(rest)
            kept = excerpt(raw, hit[1] + offset, hit[2] + offset)
            found.append(Standing(hit[0], " ".join(kept.split()), (sentence,)))
    whole = text.strip()
    if (
        found
        and len(found) == len(spans)
        and len({item.label for item in found}) == 1
        and len(whole) <= STANDING_CHARS
        and "\n" not in whole
        and not CODE_FENCE.search(whole)
    ):
        return [
            Standing(found[0].label, " ".join(whole.split()), tuple(s for f in found for s in f.sentences))
        ]
    return found
