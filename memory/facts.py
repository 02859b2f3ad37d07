"""Specific details in a sentence, and what a fact is about.

The memory agent's rules keep a detail a user states in passing ("the ledger staging DB is on port 23456",
"alerts go to #ops-falcon") when the sentence carries a specific value: an identifier with digits, an e-mail
address, a host name, a Slack channel, a version, an ISO date, an amount, a phone number, a rate limit, a
person named as owner or contact. Archival memory compares the signatures of two such facts (their content
words without the values) to decide that a newer one with a different value replaces the older one."""

import functools
import re
from dataclasses import dataclass

from providers.text import FACT_STOPWORDS, FILE_EXTENSIONS, MONTHS, URL_TAIL, WEEKDAYS, wordset

# --- lead-ins ----------------------------------------------------------------------------------------------
# Conversational openers in front of the statement itself. A memo lead-in says the user wants it kept. Those
# that are also ordinary words ("Note", "Important") only count when punctuation follows ("Note:").
_MEMO_LEAD = (
    r"note for later|note to self|note that|for the record|for future reference|keep in mind(?: that)?|"
    r"don'?t forget(?: that)?|heads[- ]up|fyi|f\.y\.i\.?|just so you know|jsyk"
)
_MEMO_LABEL = r"note|important|psa|reminder|for later|for reference"
_PLAIN_LEAD = r"btw|by the way|oh|also|anyway|so"
_PLAIN_LABEL = r"ok|okay|quick note|side note|small thing|one more thing|update"
_PUNCT = r"\s*[:,;!—–-]+\s*"
_LEAD_IN = re.compile(
    rf"^(?:(?P<memo>{_MEMO_LEAD})(?:{_PUNCT}|\s+)|(?P<label>{_MEMO_LABEL}){_PUNCT}"
    rf"|(?:{_PLAIN_LEAD})(?:{_PUNCT}|\s+)|(?:{_PLAIN_LABEL}){_PUNCT})(?=\S)",
    re.I,
)


def strip_lead_in(sentence: str) -> tuple[str, bool]:
    """The sentence without its conversational lead-ins ("btw", "heads-up,", "note for later:"), and whether
    one of them asked for it to be kept."""
    memo = False
    for _ in range(3):  # "oh btw, fyi: …"
        match = _LEAD_IN.match(sentence)
        if match is None:
            break
        memo = memo or bool(match.group("memo") or match.group("label"))
        sentence = sentence[match.end() :]
    return sentence, memo


# --- specific values ---------------------------------------------------------------------------------------

_TLD = r"com|net|org|io|dev|app|cloud|internal|local|lan|corp|example|ai|co|biz|info"
_NAME_WORD = r"[A-ZÀ-ÖØ-Þ][a-zà-öø-ÿ'’]+(?:-[A-ZÀ-ÖØ-Þ][a-zà-öø-ÿ'’]+)?"
_NAME = (
    rf"(?!(?:The|This|That|These|Those|Our|My|Your|We|It|Its|Their)\b){_NAME_WORD}"
    rf"(?:\s+(?:(?:van|von|de|da|di|del|der|le|la|bin|ibn)\s+)?{_NAME_WORD}){{1,2}}"
)
_ROLE = r"(?i:owner|lead|tech lead|manager|maintainer|contact|point of contact|approver|on-call|on call)"
# A full name only counts in a position that says what the person is to the subject.
_PERSON = re.compile(
    rf"(?P<p1>{_NAME})\s+(?i:has\s+|now\s+)?(?i:took|takes|taken|is taking) over\b"
    rf"|(?P<p2>{_NAME})\s+(?i:now\s+)?(?i:owns|leads|runs|maintains|manages)\b"
    rf"|(?P<p3>{_NAME})\s+(?i:is|will be)\s+(?i:now\s+)?(?i:the\s+|our\s+|my\s+)?(?i:new\s+)?{_ROLE}\b"
    rf"|\b(?i:owned|led|run|maintained|managed|handled|approved|signed off)\s+by\s+(?P<p4>{_NAME})"
    rf"|\b{_ROLE}\s+(?i:is|was|:)\s+(?i:now\s+)?(?P<p5>{_NAME})"
    rf"|\b(?i:talk to|reach out to|escalate to|go to|goes to|ask)\s+(?P<p6>{_NAME})"
)
_TWO_CAPITALS = re.compile(r"[A-ZÀ-ÖØ-Þ][a-zà-öø-ÿ'’]+(?:-[A-ZÀ-ÖØ-Þ][a-zà-öø-ÿ'’]+)?\s+[A-ZÀ-ÖØ-Þ]")
_LIMIT_WORD = re.compile(r"\b(?:limit\w*|throttl\w*|quota\w*|caps?|capped|max|maximum|rate)\b", re.I)
# A snake_case or CONSTANT_CASE name counts without digits when it is introduced as a name.
_NAMED = re.compile(
    r"\b(?:called|named|flag|toggle|setting|variable) `?(?P<v>[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+)`?"
)
# (kind, pattern): earlier patterns claim their text first.
_VALUE_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("email", re.compile(r"(?<![\w.+-])[\w.+-]+@[a-z0-9-]+(?:\.[a-z0-9-]+)+", re.I)),
    ("url", re.compile(rf"\b(?:https?|s3|gs|ssh|git)://{URL_TAIL}", re.I)),
    ("host", re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d{2,5})?(?![\w.]*\w)")),
    ("version", re.compile(r"(?<![\w.])v?\d+\.\d+\.\d+(?:[-+][0-9a-z.]+)?(?![\w.]*\w)", re.I)),
    (
        "host",
        re.compile(
            r"(?<![\w./@-])(?=[\w.-]*[a-z])[a-z0-9][a-z0-9-]*(?:\.[a-z0-9][a-z0-9-]*)*"
            r"\.(?:[a-z][a-z0-9-]*[a-z0-9])(?::\d{2,5})?(?![\w/@-]|\.\w)",
            re.I,
        ),
    ),
    ("date", re.compile(r"(?<![\w-])\d{4}-[01]\d-[0-3]\d(?![\w:-])")),
    (
        "amount",
        re.compile(
            r"[$€£¥]\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:k|m|bn|million|thousand)\b)?"
            r"|(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:USD|EUR|GBP|CHF|dollars|euros|pounds)\b"
        ),
    ),
    ("phone", re.compile(r"(?<![\w+])\+\d{1,3}(?:[\s.-]?\(?\d{1,5}\)?){2,5}(?![\w])")),
    ("channel", re.compile(r"(?<![\w#&])#[a-z][a-z0-9_-]{2,}")),
    ("port", re.compile(r"\bport\s+(?:number\s+)?(?:is\s+|of\s+|to\s+|=\s*|:\s*)?\d{2,5}\b", re.I)),
    (
        "rate",
        re.compile(
            r"(?<![\w.])\d[\d,.]*\s?k?\s*(?:[a-z]+\s+){0,2}(?:per|/|an?|every)\s?"
            r"(?:second|sec|s|minute|min|hour|hr|h|day)\b",
            re.I,
        ),
    ),
    ("id", re.compile(r"(?<![\w/.@#$-])[A-Za-z0-9]+(?:[-_.][A-Za-z0-9]+)+(?![\w/@-]|\.[A-Za-z0-9])")),
    ("id", re.compile(r"\b(?:[A-Z][a-z]+){2,}\d{2,}\b|\b[A-Z]{2,}\d{3,}\b")),
    ("id", _NAMED),
]
# Identifiers that are vocabulary, not a value of the user's (an encoding, a percentile, an architecture).
_COMMON_ID = re.compile(
    r"^(?:p\d+(?:\.\d+)?|x86[-_]64|utf-?\d+|sha-?\d+|iso-?\d+|ipv\d|http/?\d(?:\.\d)?|tls-?\d(?:\.\d)?|"
    r"h\d|e\d+|[a-z]\d|\d+(?:[-.]\d+)*|\d+[a-z]{1,3}|[a-z]{1,3}\d{1,2}|k8s|i18n|l10n|a11y)$",
    re.I,
)


@dataclass(frozen=True)
class Value:
    kind: str
    text: str
    start: int
    end: int


def _id_counts(token: str) -> bool:
    """An identifier with separators is a value when it is not a file name, not common vocabulary, and has
    digits enough to be specific: two, or one in three parts or more (acme-archive-eu2)."""
    token = token.strip("`")
    if len(token) < 5 or _COMMON_ID.match(token):
        return False
    parts = re.split(r"[-_.]", token)
    if "." in token and parts[-1].lower() in FILE_EXTENSIONS:
        return False
    digits = sum(c.isdigit() for c in token)
    if not any(c.isalpha() for c in token):
        return False
    return digits >= 2 or (digits >= 1 and len(parts) >= 3)


def specific_values(sentence: str) -> list[Value]:
    """The specific values in a sentence, in order, without overlaps."""
    taken: list[tuple[int, int]] = []
    found: list[Value] = []

    def free(start: int, end: int) -> bool:
        return all(end <= s or start >= e for s, e in taken)

    def add(kind: str, start: int, end: int) -> None:
        taken.append((start, end))
        found.append(Value(kind, sentence[start:end].strip("`"), start, end))

    if _TWO_CAPITALS.search(sentence):  # a cheap test first: most sentences name nobody
        for match in _PERSON.finditer(sentence):
            group = next(g for g in ("p1", "p2", "p3", "p4", "p5", "p6") if match.group(g))
            add("person", match.start(group), match.end(group))
    limits = bool(_LIMIT_WORD.search(sentence))
    for kind, pattern in _VALUE_PATTERNS:
        if kind == "rate" and not limits:
            continue
        for match in pattern.finditer(sentence):
            start, end = match.span("v" if "v" in pattern.groupindex else 0)
            if not free(start, end):
                continue
            text = sentence[start:end]
            if kind == "host":
                last = text.rsplit(":", 1)[0].rsplit(".", 1)[-1].lower()
                dotted = text.count(".")
                if last in FILE_EXTENSIONS or (dotted < 2 and not re.fullmatch(_TLD, last)):
                    continue
                if text.lower() in ("e.g", "i.e"):
                    continue
            if kind == "id" and not (pattern is _NAMED or _id_counts(text)):
                continue
            if kind == "port":
                start = end - len(re.search(r"\d+$", text).group(0))  # type: ignore[union-attr]
            add(kind, start, end)
    return sorted(found, key=lambda v: v.start)


# Never kept: what reads as a secret (a password stated, a token-shaped string).
_SECRET = re.compile(
    r"(?i:\b(?:password|passwd|passphrase|pass phrase|secret|api[ _-]?key|access[ _-]?key|private key|token|"
    r"pin)\s*(?:is|was|are|:|=)\s*\S)"
    r"|\b(?:sk|pk|rk)[-_](?:live|test|proj)?[-_]?[A-Za-z0-9]{12,}|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\bxox[abposr]-[\w-]{10,}|\bAKIA[0-9A-Z]{16}\b|-----BEGIN|\beyJ[\w-]{10,}\.[\w-]{10,}"
    # A long run of mixed-case letters and digits without word separators: a key, not a name.
    r"|(?<![\w/.-])(?=[A-Za-z0-9+/]{24,})(?=\S*\d)(?=\S*[a-z])(?=\S*[A-Z])[A-Za-z0-9+/]{24,}={0,2}(?![\w/-])"
)


def looks_secret(sentence: str) -> bool:
    return bool(_SECRET.search(sentence))


# --- what a fact is about ----------------------------------------------------------------------------------

_WORD = re.compile(r"[a-zà-öø-ÿ][a-zà-öø-ÿ0-9'’-]*[a-zà-öø-ÿ0-9]|[a-zà-öø-ÿ]")
# Where a clause ends.
_CLAUSE = re.compile(
    r"[;:,]\s+|\s[-–—]\s|\s\((?=\w)|\)\s"
    r"|\s(?=(?:until|till|because|unless|so that|in case|although|though|whereas|otherwise|except)\b)",
    re.I,
)
# A later clause without a value that starts like this is an aside (a reason, a condition, a request, a
# remark about someone): "…, in case anything catches fire", "…, please reference it in the postmortem".
_ASIDE = re.compile(
    r"\s*(?:until|till|because|since|unless|so|but|although|though|while|whereas|please|otherwise|except|"
    r"in case|it|it's|it’s|that|that's|this|they|they're|she|he|who|which|there|i|we)\b",
    re.I,
)
# Words that say a value changed (or how it is phrased), not what it belongs to.
_CHANGE_WORDS = wordset("""
now again new newer old older previous previously former formerly current currently latest anymore longer
instead change changed changes changing move moved moves migrate migrated switch switched rename renamed
rotate rotated rekey rekeyed re-key re-keyed replace replaced update updated use used using got get gets
become became becomes bump bumped raise raised lower lowered cut increase increased decrease decreased
reduce reduced push pushed postpone postponed merge merged decommission decommissioned retire retired gone
deprecate deprecated took take takes taken over effective going forward decide decided agree agreed
""")
# Words about time, not about the thing.
_TIME_WORDS = wordset("""
today tonight tomorrow yesterday morning afternoon evening night nightly daily weekly monthly yearly week
weeks month months year years quarter sprint day days hour hours minute minutes earlier later soon
recently last next ago starting start starts started from until till time times eod eow asap
""") | {name.lower() for name in (*WEEKDAYS, *MONTHS)}
# Different words for one thing (after lower-casing; the stemmer runs after).
_SYNONYMS = {
    **dict.fromkeys(wordset("db dbs database databases postgres postgresql pg mysql mariadb"), "database"),
    **dict.fromkeys(wordset("toggle toggles flag flags"), "flag"),
    **dict.fromkeys(wordset("box boxes machine machines server servers host hosts vm vms"), "host"),
    **dict.fromkeys(wordset("jumphost jumpbox bastion"), "bastion"),
    **dict.fromkeys(
        wordset("throttle throttles throttled throttling ratelimit ratelimits quota quotas cap capped"),
        "limit",
    ),
    **dict.fromkeys(wordset("creds credential credentials"), "credential"),
    **dict.fromkeys(wordset("e-mail mail email"), "email"),
    "prod": "production",
    "env": "environment",
    "repo": "repository",
    "k8s": "kubernetes",
}
# Verbs and nouns that say how a value relates to its subject: two sentences that differ only in these can
# still be about the same thing ("answers on port …" / "listens on port …").
_SOFT_WORDS = wordset("""
listen answer respond run live sit point send post go land write read reach hop connect call serve hit talk
ask reference open file create set put keep store hold find have say tell know see look work stay mean plan
need want question people team folk guy use reply stand
""")
# Qualifiers that make two otherwise alike facts about different things (staging vs production).
_QUALIFIER_WORDS = wordset("""
staging stage production prod dev development test testing qa uat sandbox preview canary local replica
primary secondary standby backup mirror readonly internal external public private legacy
""")


@functools.lru_cache(maxsize=16384)
def _stem(word: str) -> str:
    """A light stemmer: enough for 'owned' / 'owner' / 'ownership' and 'alerts' / 'alerting' to meet."""
    word = _SYNONYMS.get(word, word).replace("-", "").replace("'", "").replace("’", "")
    if word in _SYNONYMS.values():
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "ches", "shes", "xes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        word = word[:-1]
    for suffix in ("ership", "ment", "ing", "ed", "er"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            if suffix in ("ing", "ed") and len(word) > 3 and word[-1] == word[-2] and word[-1] not in "ls":
                word = word[:-1]  # pinned -> pin
            break
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return word


_CHANGE = frozenset(_stem(w) for w in _CHANGE_WORDS) | frozenset(_CHANGE_WORDS)
_TIME = frozenset(_TIME_WORDS)
_SOFT = frozenset(_stem(w) for w in _SOFT_WORDS)
_QUALIFIERS = frozenset(_stem(_SYNONYMS.get(w, w)) for w in _QUALIFIER_WORDS)


def _words(text: str) -> dict[str, str]:
    """Content words: stem -> the word as written (its first occurrence)."""
    out: dict[str, str] = {}
    for word in _WORD.findall(text.lower()):
        word = re.sub(r"['’]s$", "", word)
        if word in FACT_STOPWORDS or word in _TIME or word in _CHANGE or any(c.isdigit() for c in word):
            continue
        stem = _stem(word)
        if stem in _CHANGE or len(stem) < 2:
            continue
        out.setdefault(stem, word)
    return out


@dataclass(frozen=True)
class Signature:
    values: frozenset[str]  # lower-cased
    kinds: frozenset[str]
    words: frozenset[str]  # content words, stemmed
    spelled: tuple[tuple[str, str], ...] = ()  # (stem, the word as written), in order

    @property
    def core(self) -> frozenset[str]:
        return self.words - _SOFT


@functools.lru_cache(maxsize=8192)
def fact_signature(content: str) -> Signature:
    """The values of a fact and the words saying what they belong to: those of its clauses but the asides
    (a later clause without a value that gives a reason, a condition, a request), without lead-ins, a short
    label, stop words, words of change and time, and the values themselves."""
    text, _ = strip_lead_in(content.strip())
    values = specific_values(text)
    if not values:
        return Signature(frozenset(), frozenset(), frozenset())
    blanked = list(text)
    for v in values:
        blanked[v.start : v.end] = " " * (v.end - v.start)
    plain = "".join(blanked)
    bounds, start = [], 0
    for match in _CLAUSE.finditer(plain):
        bounds.append((start, match.start(), match.group(0)))
        start = match.end()
    bounds.append((start, len(plain), ""))
    words: dict[str, str] = {}
    for i, (s, e, ends_with) in enumerate(bounds):
        clause = plain[s:e]
        if any(s <= v.start < e for v in values):
            words |= {k: v for k, v in _words(clause).items() if k not in words}
        elif i == 0:
            # The main clause, unless it is a short label: "Org change: ledger is owned by …".
            rest = set(_words(plain[e:])) - _SOFT
            if not (ends_with.startswith(":") and len(_WORD.findall(clause.lower())) <= 3 and rest):
                words |= {k: v for k, v in _words(clause).items() if k not in words}
        elif not _ASIDE.match(clause):
            words |= {k: v for k, v in _words(clause).items() if k not in words}
    return Signature(
        frozenset(v.text.lower() for v in values),
        frozenset(v.kind for v in values),
        frozenset(words),
        tuple(words.items()),
    )


def supersedes(new: Signature, old: Signature) -> list[str]:
    """The words (as the new fact writes them) two facts share when the new one states a different value for
    the same thing as the old one; empty otherwise. Conservative: the same kind of value, no value in common,
    at least two shared words (or the same single one), at most one side saying more, and no qualifier
    (staging, replica) on the side that does."""
    if not new.values or not old.values or new.values & old.values or not new.kinds & old.kinds:
        return []
    a, b = new.core, old.core
    shared = a & b
    if not shared or (len(shared) < 2 and a != b):
        return []
    extra_new, extra_old = a - b, b - a
    if extra_new and extra_old:  # each names something the other does not: ledger / checkout
        return []
    if (extra_new | extra_old) & _QUALIFIERS:
        return []
    if len(shared) / len(a | b) < 0.5:
        return []
    return [word for stem, word in new.spelled if stem in shared]
