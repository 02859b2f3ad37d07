"""Blocks into chunks of about TARGET_TOKENS (never more than MAX_TOKENS), split on structure first: a
chunk holds blocks of one section (page, heading path, sheet) only, whole blocks where they fit, and a
block too long for one chunk is cut on sentences, then words. Consecutive chunks of one section share a
short overlap (the previous chunk's last block or sentence, up to OVERLAP_TOKENS), so a fact that straddles
the cut is whole in one of them."""

import re
from dataclasses import dataclass

from knowledge.extract import Block, cell_range
from providers.tokens import count_text

TARGET_TOKENS = 400
MAX_TOKENS = 500
OVERLAP_TOKENS = 60

_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")


@dataclass
class Draft:
    """A chunk before it is stored: its text and provenance."""

    content: str
    page: int | None = None
    heading: str = ""
    sheet: str = ""
    cell_range: str = ""
    start_line: int | None = None
    end_line: int | None = None
    path: str = ""
    symbol: str = ""
    language: str = ""
    tokens: int = 0


def _pieces(block: Block) -> list[tuple[str, int]]:
    """The block as (text, tokens) pieces no longer than MAX_TOKENS: itself, or its sentences (a sentence
    that is still too long cut by words)."""
    tokens = count_text(block.text)
    if tokens <= MAX_TOKENS:
        return [(block.text, tokens)]
    out: list[tuple[str, int]] = []
    for sentence in _SENTENCE.split(block.text):
        if not sentence.strip():
            continue
        size = count_text(sentence)
        if size <= MAX_TOKENS:
            out.append((sentence, size))
            continue
        words = sentence.split()
        step = max(1, int(len(words) * TARGET_TOKENS / size))
        for i in range(0, len(words), step):
            text = " ".join(words[i : i + step])
            out.append((text, count_text(text)))
    return out


def _provenance(blocks: list[Block]) -> dict[str, object]:
    first = blocks[0]
    rows = [b.row for b in blocks if b.row is not None]
    lines = [b for b in blocks if b.start_line is not None]
    return {
        "page": first.page,
        "heading": first.heading,
        "sheet": first.sheet,
        "cell_range": cell_range(min(rows), max(rows), max(b.columns for b in blocks)) if rows else "",
        "start_line": lines[0].start_line if lines else None,
        "end_line": lines[-1].end_line if lines else None,
    }


def chunk_blocks(blocks: list[Block]) -> list[Draft]:
    drafts: list[Draft] = []
    section: list[tuple[Block, str, int]] = []  # (block, piece text, tokens) of the current section
    for block in blocks:
        if section and block.section != section[0][0].section:
            drafts += _pack(section)
            section = []
        section += [(block, text, tokens) for text, tokens in _pieces(block)]
    if section:
        drafts += _pack(section)
    return drafts


def _pack(pieces: list[tuple[Block, str, int]]) -> list[Draft]:
    """One section's pieces packed greedily up to TARGET_TOKENS, each chunk after the first starting with
    the previous chunk's last piece when it is short enough to serve as overlap."""
    drafts: list[Draft] = []
    current: list[tuple[Block, str, int]] = []
    size = 0
    for piece in pieces:
        if current and size + piece[2] > TARGET_TOKENS:
            drafts.append(_draft(current))
            tail = _overlap(current[-1])
            current, size = ([tail], tail[2]) if tail else ([], 0)
        current.append(piece)
        size += piece[2]
    if current:
        drafts.append(_draft(current))
    return drafts


def _overlap(piece: tuple[Block, str, int]) -> tuple[Block, str, int] | None:
    """The end of a piece, at most OVERLAP_TOKENS: its last sentences, else its last words."""
    block, text, tokens = piece
    if tokens <= OVERLAP_TOKENS:
        return piece
    sentences = [s for s in _SENTENCE.split(text) if s.strip()]
    tail = ""
    for sentence in reversed(sentences):
        candidate = f"{sentence} {tail}".strip()
        if count_text(candidate) > OVERLAP_TOKENS:
            break
        tail = candidate
    if not tail:
        words = text.split()
        tail = " ".join(words[-max(1, len(words) * OVERLAP_TOKENS // (2 * tokens)) :])
    return (block, tail, count_text(tail))


def _draft(pieces: list[tuple[Block, str, int]]) -> Draft:
    blocks = [b for b, _t, _n in pieces]
    provenance = _provenance(blocks)
    content = "\n\n".join(text for _b, text, _n in pieces)
    return Draft(content=content, tokens=count_text(content), **provenance)  # type: ignore[arg-type]
