"""Ranking mechanics of the in-process search indexes (memory.history_index over a conversation's passages,
knowledge.search over a tenant's chunks): BM25 postings scored as a share of what the query could score,
cosine similarity over stored vectors, ranks among the eligible items, and reciprocal rank fusion.

An item is a position (0, 1, 2, … in the order items were added); what the items are, how their terms are
cut and which of them a search may return stay with each index."""

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

K1 = 1.2
B = 0.75
RRF_K = 60


class Postings:
    """An append-only BM25 table: per term, the items holding it and how often; per item, its length."""

    def __init__(self) -> None:
        self.terms: dict[str, tuple[array, array]] = {}  # term -> (positions, term frequencies)
        self.lengths = array("i")
        self._norm: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    def add(self, counts: Mapping[str, int]) -> None:
        """Append the next item, given how often it holds each of its terms."""
        position = len(self.lengths)
        self.lengths.append(sum(counts.values()))
        for term, tf in counts.items():
            posting = self.terms.get(term)
            if posting is None:
                posting = self.terms[term] = (array("i"), array("i"))
            posting[0].append(position)
            posting[1].append(tf)

    def _length_norm(self) -> np.ndarray:
        """BM25's per-item length term, computed again only when items were added."""
        if self._norm is None or len(self._norm) != len(self.lengths):
            lengths = np.frombuffer(self.lengths, dtype=np.int32).astype(np.float32)
            self._norm = K1 * (1 - B + B * lengths / max(float(lengths.mean()), 1.0))
        return self._norm

    def bm25(self, query_terms: Iterable[str]) -> np.ndarray:
        """BM25 of every item, as a share of the most the query's terms could score (each term's IDF times
        k1 + 1): 1.0 would be every term of the query, each many times; an item holding only the common
        terms of a query scores near 0, whatever the corpus."""
        count = len(self.lengths)
        scores = np.zeros(count, dtype=np.float32)
        if not count:
            return scores
        ceiling = 0.0
        norm = self._length_norm()
        for term in set(query_terms):
            posting = self.terms.get(term)
            if posting is None:
                continue
            where = np.frombuffer(posting[0], dtype=np.int32)
            tf = np.frombuffer(posting[1], dtype=np.int32).astype(np.float32)
            idf = math.log(1 + (count - len(where) + 0.5) / (len(where) + 0.5))
            scores[where] += idf * tf * (K1 + 1) / (tf + norm[where])
            ceiling += idf * (K1 + 1)
        return scores / ceiling if ceiling else scores


class Vectors:
    """The vectors of some items (normalised, of one embedding model), scored by cosine similarity with a
    query through one matrix, built when first asked for after a change."""

    def __init__(self) -> None:
        self.model = ""
        self._vectors: dict[int, np.ndarray] = {}
        self._matrix: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self._vectors)

    def __setitem__(self, position: int, vector: np.ndarray) -> None:
        self._vectors[position] = vector
        self._matrix = None

    def get(self, position: int) -> np.ndarray | None:
        """The item's vector, None when it has none."""
        return self._vectors.get(position)

    def use_model(self, model: str) -> None:
        """Vectors of another model do not compare with this one's: a change of model forgets them all."""
        if model != self.model:
            self.model, self._vectors, self._matrix = model, {}, None

    def similarity(self, query_vector: np.ndarray | None, size: int) -> np.ndarray:
        """Cosine of each of `size` items with the query (0: no vector, or one of another dimension)."""
        scores = np.zeros(size, dtype=np.float32)
        if query_vector is None or not self._vectors:
            return scores
        if self._matrix is None:
            keys = np.fromiter(self._vectors.keys(), dtype=np.int64, count=len(self._vectors))
            matrix = np.vstack([self._vectors[k] for k in keys.tolist()]).astype(np.float32)
            self._matrix = (keys, matrix)
        keys, matrix = self._matrix
        if matrix.shape[1] == len(query_vector):
            scores[keys] = matrix @ query_vector.astype(np.float32)
        return scores


def ranks(scores: np.ndarray, eligible: np.ndarray, depth: int) -> np.ndarray:
    """1-based rank of each item among the eligible ones with a positive score, for the best `depth`
    (0: unranked). Equal scores keep the order of their positions."""
    out = np.zeros(len(scores), dtype=np.int64)
    candidates = np.flatnonzero(eligible & (scores > 0))
    if not len(candidates):
        return out
    if len(candidates) > depth:
        top = np.argpartition(-scores[candidates], depth - 1)[:depth]
        candidates = candidates[top]
    order = candidates[np.argsort(-scores[candidates], kind="stable")]
    out[order] = np.arange(1, len(order) + 1)
    return out


def fuse(
    rankings: Iterable[tuple[float | np.ndarray, np.ndarray]], eligible: np.ndarray, depth: int
) -> np.ndarray:
    """Reciprocal rank fusion of score arrays: each item scores the sum, over the (weight, scores) rankings,
    of weight / (RRF_K + its rank there), ranked among the eligible items to `depth`. A weight is one number
    or an array with a weight per item."""
    fused = np.zeros(len(eligible), dtype=np.float64)
    for weight, scores in rankings:
        rank = ranks(scores, eligible, depth)
        ranked = rank > 0
        weights = weight[ranked] if isinstance(weight, np.ndarray) else weight
        fused[ranked] += weights / (RRF_K + rank[ranked])
    return fused


def best_first(fused: np.ndarray, limit: int) -> np.ndarray:
    """Positions of the `limit` best positive scores, best first (equal scores in position order)."""
    best = np.flatnonzero(fused > 0)
    return best[np.argsort(-fused[best], kind="stable")][:limit]


def rrf(*rankings: Sequence[Any], k: int = RRF_K) -> dict[Any, float]:
    """Reciprocal rank fusion of ranked lists of keys: each key scores the sum of 1 / (k + rank) over the
    rankings it appears in."""
    fused: dict[Any, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            fused[key] = fused.get(key, 0.0) + 1.0 / (k + rank)
    return fused
