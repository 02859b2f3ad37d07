"""Identifier-aware terms, the same on both sides of search: `getUserName`, `get_user_name` and
`HTTPServerError` are split into their words (get, user, name; http, server, error), each stemmed, and the
joins of neighbouring words are terms too (getuser, username, getusername), so the query "get user name"
finds `getUsername` and the query `getUsername` finds "get user name"."""

import itertools
import re
from functools import lru_cache

import snowballstemmer

# No stopword list: BM25's IDF already weighs "the" and "of" near zero, and in code search they carry the
# phrasing a docstring query repeats (bench/knowledge.py ranks docstring queries better without a list).
_IDENTIFIER = re.compile(r"[^\W_]+(?:_+[^\W_]+)*|[^\W\d_]+", re.UNICODE)
# An acronym before a capitalised word, a capitalised or lower-case word, an acronym, digits.
_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+|[^\W\d_A-Za-z]+")
MAX_JOIN = 4
_stemmer = snowballstemmer.stemmer("english")


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    return _stemmer.stemWord(word) if word.isalpha() else word


@lru_cache(maxsize=100_000)
def split_identifier(identifier: str) -> tuple[str, ...]:
    """The lower-case words of an identifier: `HTTPServerError` → (http, server, error)."""
    words: list[str] = []
    for piece in identifier.split("_"):
        words += [p.lower() for p in _PART.findall(piece)]
    return tuple(words)


def _joins(words: list[str]) -> list[str]:
    """Neighbouring words run together: pairs, and the whole run when it is short."""
    out = [a + b for a, b in itertools.pairwise(words)]
    if 2 < len(words) <= MAX_JOIN:
        out.append("".join(words))
    return [_stem(w) for w in out]


def terms(text: str) -> list[str]:
    """BM25 terms of an indexed text: every identifier's words (stemmed, stopwords out) and its joins."""
    out: list[str] = []
    for identifier in _IDENTIFIER.findall(text):
        words = split_identifier(identifier)
        out += [_stem(w) for w in words if len(w) > 1 or w.isdigit()]
        if len(words) > 1:
            out += _joins(list(words))
    return out


# Words that mark a sentence rather than a name.
PROSE_MARKERS = frozenset({"the", "a", "an", "of"})
NAME_WORDS = 6


def looks_like_a_name(query: str) -> bool:
    """A short query without articles ("get user name", "QuerySet filter"), not a sentence: what fuzzy
    symbol matching and joined words are for. On prose (a docstring's sentence) both only add noise
    (bench/knowledge.py ranks prose queries better without them)."""
    words = re.findall(r"[^\W_]+", query.lower())
    return len(words) <= NAME_WORDS and not PROSE_MARKERS.intersection(words)


def query_terms(query: str) -> list[str]:
    """Terms of a question: those of terms(), plus, for a name-like query, the joins of neighbouring words
    across identifiers, so "user name" also asks for `username`."""
    out = terms(query)
    if not looks_like_a_name(query):
        return out
    words = [w for ident in _IDENTIFIER.findall(query) for w in split_identifier(ident)]
    return out + _joins(words)


def identifier_words(text: str) -> str:
    """The identifiers of a text as space-separated words (what Chunk.identifiers stores)."""
    seen: dict[str, None] = {}
    for identifier in _IDENTIFIER.findall(text):
        words = split_identifier(identifier)
        if len(words) > 1:
            seen[" ".join(words)] = None
    return "\n".join(seen)


def symbol_words(symbol: str) -> str:
    """A qualified symbol as lower-case words: `Invoice.renderPDF` → "invoice render pdf"."""
    return " ".join(w for ident in _IDENTIFIER.findall(symbol) for w in split_identifier(ident))


# --- trigram similarity, as PostgreSQL's pg_trgm computes it ---------------------------------------------


def trigrams(text: str) -> frozenset[str]:
    """pg_trgm's trigrams: each lower-case alphanumeric word padded with two spaces before and one after."""
    out: set[str] = set()
    for word in re.findall(r"[^\W_]+", text.lower()):
        padded = f"  {word} "
        out.update(padded[i : i + 3] for i in range(len(padded) - 2))
    return frozenset(out)


def trigram_similarity(a: frozenset[str], b: frozenset[str]) -> float:
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)
