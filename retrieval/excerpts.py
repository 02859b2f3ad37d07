"""Excerpts: which span of a long message a hit shows (its passage, grown until it says enough)."""

import re
from itertools import islice

from providers.passages import PASSAGE_WORDS

# A long message's excerpt shows at least a full passage's words (its passage and what follows it): a short
# passage (a heading, the tail of a reply) alone rarely says enough to be used.
EXCERPT_MIN_WORDS = PASSAGE_WORDS
_WORD = re.compile(r"\S+")


def excerpt_span(content: str, start: int, end: int) -> tuple[int, int]:
    """A passage of a long message, grown to at least EXCERPT_MIN_WORDS words with the text that follows it
    (or, at the message's end, precedes it): a short passage (a heading, the tail of a reply) alone rarely
    says enough to be used. Reads the words it needs, not the whole message."""
    missing = EXCERPT_MIN_WORDS - len(_WORD.findall(content, start, end))
    if missing <= 0:
        return start, end
    after = list(islice(_WORD.finditer(content, end), missing))
    if after:
        end = after[-1].end()
    missing -= len(after)
    if missing > 0:
        before = _words_before(content, start, missing)
        start = before[-min(missing, len(before))] if before else start
    return start, end


def _words_before(content: str, start: int, wanted: int) -> list[int]:
    """The starts of the words before `start`, at least the last `wanted` of them (all when there are fewer):
    read from a window before `start` that doubles until it holds them, not from the message's beginning (a
    hit at the end of a long reply would otherwise read all of it)."""
    window = 16 * wanted
    while True:
        low = max(0, start - window)
        starts = [word.start() for word in _WORD.finditer(content, low, start)]
        if low > 0 and starts and starts[0] == low and not content[low - 1].isspace():
            starts = starts[1:]  # the window began inside a word: its start lies further back
        if len(starts) >= wanted or low == 0:
            return starts
        window *= 2
