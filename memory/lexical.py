"""Lexical ranking shared by archival memory and recall over old messages: BM25 over words (and character
bigrams for CJK text, which has no spaces), computed in Python over the end user's own rows, so it behaves
the same on SQLite and PostgreSQL; plus reciprocal rank fusion."""

import functools
import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

RRF_K = 60
_WORD = re.compile(r"[a-z0-9][a-z0-9_\-./]*|[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]+", re.I)
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "with",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "i",
        "you",
        "he",
        "she",
        "we",
        "they",
        "me",
        "my",
        "your",
        "our",
        "their",
        "do",
        "does",
        "did",
        "what",
        "which",
        "who",
        "whom",
        "how",
        "when",
        "where",
        "why",
        "can",
        "could",
        "would",
        "should",
        "will",
        "shall",
        "not",
        "no",
        "yes",
        "so",
        "as",
        "by",
        "from",
        "about",
        "into",
        "than",
        "then",
        "there",
        "here",
        "just",
        "also",
        "please",
    ]
)


def tokens(text: str) -> list[str]:
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        word = word.strip("-./_")
        if not word:
            continue
        # A match is either all CJK or starts with [a-z0-9]: the first character tells which.
        if word[0] >= "\u3040":
            out.extend(word)  # unigrams
            out.extend(word[i : i + 2] for i in range(len(word) - 1))  # and bigrams
        elif word not in STOPWORDS:
            out.append(word)
    return out


@functools.lru_cache(maxsize=8192)
def _document_terms(text: str) -> Counter:
    """Term counts of a document. Memoised: recall ranks the same history messages call after call."""
    return Counter(tokens(text))


def bm25_rank(
    query: str,
    documents: Sequence[str],
    *,
    k1: float = 1.2,
    b: float = 0.75,
    corpus_size: int | None = None,
) -> list[tuple[int, float]]:
    """(document index, score) of the documents sharing a term with the query, best first. When the
    documents are a prefiltered part of a larger corpus, corpus_size keeps the IDF of the whole."""
    terms = set(tokens(query))
    if not terms or not documents:
        return []
    docs = [_document_terms(d) for d in documents]
    avg = sum(sum(d.values()) for d in docs) / len(docs) or 1.0
    df = Counter(t for d in docs for t in terms if t in d)
    n = max(corpus_size or 0, len(docs))
    scored = []
    for i, d in enumerate(docs):
        length = sum(d.values())
        score = 0.0
        for t in terms:
            tf = d.get(t, 0)
            if not tf:
                continue
            idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avg))
        if score > 0:
            scored.append((i, score))
    scored.sort(key=lambda x: (-x[1], x[0]))
    return scored


def rrf(*rankings: Sequence[Any], k: int = RRF_K) -> dict[Any, float]:
    """Reciprocal rank fusion: each key scores the sum of 1 / (k + rank) over the rankings it appears in."""
    fused: dict[Any, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            fused[key] = fused.get(key, 0.0) + 1.0 / (k + rank)
    return fused


def jaccard(a: str, b: str) -> float:
    ta, tb = set(tokens(a)), set(tokens(b))
    if not ta or not tb:
        return 0.0
    return len(ta & tb) / len(ta | tb)
