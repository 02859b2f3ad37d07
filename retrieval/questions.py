"""Reading a question for the search of this conversation's history: the text it is embedded with, whom and
when it speaks of, and the preferences (speaker, period) those call for in the ranking."""

import dataclasses
import re

from providers.dates import Period, question_period
from retrieval.history import Preference, said_by, said_in

# A question that speaks of a participant (by name, or of the asker as "I") is answered by what that person
# said: their turns weigh this many times more.
SPEAKER_PRIOR = 2.5
FIRST_PERSON = frozenset({"i", "my", "me", "mine", "i'm", "i've", "i'd", "myself"})
# A question that names a period ("in May 2023") asks about what happened then: messages said in it, or whose
# "yesterday" or "last month" falls in it, weigh this many times more.
PERIOD_PRIOR = 2.0
_NAME_WORD = re.compile(r"[^\W\d_][\w'’-]*")
_POSSESSIVE = re.compile(r"['’]s?$")


def focused(question: str) -> str:
    """The text a question is embedded with: its words, whatever its phrasing (the pipeline embeds it ahead
    of the search)."""
    return " ".join(question.split())


@dataclasses.dataclass(frozen=True)
class Asked:
    """What a question says about whom and when: the participants it names (case-folded), whether it speaks
    of the asker ("I", "my"), the period it names, and its words without the names (for BM25: the speaker
    preference stands for them, and a greeting that names the person matches nothing else)."""

    names: frozenset[str]
    asker: bool
    period: Period | None
    lexical: str


def asked(question: str, participants: dict[str, str]) -> Asked:
    """Read a question against the conversation's named speakers (case-folded -> as written). A participant
    is named when one of the words of their name appears capitalised in the question."""
    named: set[str] = set()
    words = _NAME_WORD.findall(question)
    capitalised = {_POSSESSIVE.sub("", w) for w in words if w[:1].isupper()}
    for key, written in participants.items():
        parts = {p for p in _NAME_WORD.findall(written) if len(p) > 1}
        if parts & capitalised:
            named.add(key)
    lexical = question
    for key in named:
        for part in _NAME_WORD.findall(participants[key]):
            lexical = re.sub(rf"\b{re.escape(part)}(?:'s|’s)?\b", " ", lexical, flags=re.IGNORECASE)
    asker = bool({w.lower() for w in words} & FIRST_PERSON)
    return Asked(frozenset(named), asker, question_period(question), " ".join(lexical.split()))


def preferences(question: Asked) -> tuple[Preference, ...]:
    """The speaker and period preferences a question's words call for (SPEAKER_PRIOR, PERIOD_PRIOR)."""
    found: list[Preference] = []
    if question.names or question.asker:
        names, asker = question.names, question.asker
        found.append((lambda index: said_by(index, names, user=asker), SPEAKER_PRIOR))
    if question.period is not None:
        period = question.period
        found.append((lambda index: said_in(index, period), PERIOD_PRIOR))
    return tuple(found)
