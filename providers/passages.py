"""Passages: the pieces of a message that retrieval indexes, embeds and quotes. A short message is one
passage; a long one (a pasted document, a long assistant reply) is cut on paragraph breaks into windows of
about PASSAGE_WORDS words, so a fact in its middle is found, and quoted, without the rest.

Spans are character offsets into the message's content; the same spans serve the lexical index, the
embedding model (whose input is limited to a few hundred word pieces) and the excerpt a prompt shows."""

import re
from bisect import bisect_left

# A message up to this many words is one passage.
WHOLE_MESSAGE_WORDS = 200
# Longer ones are packed into windows of at most this many words (a model reads ~256 word pieces).
PASSAGE_WORDS = 150

_WORD = re.compile(r"\S+")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def _paragraphs(text: str) -> list[tuple[int, int]]:
    spans, start = [], 0
    for match in _PARAGRAPH_BREAK.finditer(text):
        if text[start : match.start()].strip():
            spans.append((start, match.start()))
        start = match.end()
    if text[start:].strip():
        spans.append((start, len(text)))
    return spans


def passage_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each passage, in order, covering every word of the text once."""
    words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    if not words:
        return []
    if len(words) <= WHOLE_MESSAGE_WORDS:
        return [(words[0][0], words[-1][1])]
    pieces: list[list[tuple[int, int]]] = []
    starts = [a for a, _ in words]
    for start, end in _paragraphs(text):
        para = words[bisect_left(starts, start) : bisect_left(starts, end)]
        # A paragraph longer than a window is cut by words.
        pieces += [para[i : i + PASSAGE_WORDS] for i in range(0, len(para), PASSAGE_WORDS)]
    spans: list[tuple[int, int]] = []
    current: list[tuple[int, int]] = []
    for piece in pieces:
        if current and len(current) + len(piece) > PASSAGE_WORDS:
            spans.append((current[0][0], current[-1][1]))
            current = []
        current = current + piece
    if current:
        spans.append((current[0][0], current[-1][1]))
    return spans


def passages(text: str) -> list[str]:
    return [text[a:b] for a, b in passage_spans(text)]
