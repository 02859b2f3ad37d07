"""Ranking mechanics of the in-process search indexes (retrieval.history over a conversation's passages,
retrieval.knowledge over a tenant's chunks): BM25 postings scored as a share of what the query could score,
cosine similarity over stored vectors, ranks among the eligible items, and reciprocal rank fusion.

An item is a position (0, 1, 2, … in the order items were added); what the items are, how their terms are
cut and which of them a search may return stay with each index."""

import math
import threading
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

import numpy as np

from retrieval import prescan

K1 = 1.2
B = 0.75
RRF_K = 60


class Postings:
    """An append-only BM25 table: per term, the items holding it and how often; per item, its length."""

    def __init__(self) -> None:
        self.terms: dict[str, tuple[array[int], array[int]]] = {}  # term -> (positions, term frequencies)
        self.lengths = array("i")
        self._norm: np.ndarray | None = None
        self._mean: tuple[int, float] | None = None  # (items it was computed over, mean length)

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
            self._norm = K1 * (1 - B + B * lengths / self._mean_length())
        return self._norm

    def _mean_length(self) -> float:
        """The items' mean length in terms (at least 1), computed again only when items were added."""
        if self._mean is None or self._mean[0] != len(self.lengths):
            mean = float(np.frombuffer(self.lengths, dtype=np.int32).astype(np.float32).mean())
            self._mean = (len(self.lengths), max(mean, 1.0))
        return self._mean[1]

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
            idf = math.log(1 + (count - len(where) + 0.5) / (len(where) + 0.5))
            scores[where] += _term_part(idf, np.frombuffer(posting[1], dtype=np.int32), norm[where])
            ceiling += idf * (K1 + 1)
        return scores / ceiling if ceiling else scores

    def share(self, query_terms: Iterable[str], counts: Mapping[str, int]) -> float:
        """What bm25() would give a document outside the table (its term counts), with the table's IDF
        and average length: a memory or a note scored on the same scale as the table's own items. A query
        term only the document holds counts as a term no item holds (the rarest)."""
        count = len(self.lengths)
        if not count:
            return 0.0
        norm = K1 * (1 - B + B * sum(counts.values()) / self._mean_length())
        score = ceiling = 0.0
        for term in set(query_terms):
            posting = self.terms.get(term)
            tf = counts.get(term, 0)
            if posting is None and not tf:
                continue  # as in bm25(): a term nothing holds is not part of what the query could score
            held = len(posting[0]) if posting is not None else 0
            idf = math.log(1 + (count - held + 0.5) / (held + 0.5))
            score += idf * tf * (K1 + 1) / (tf + norm)
            ceiling += idf * (K1 + 1)
        return score / ceiling if ceiling else 0.0


def _term_part(idf: float, frequencies: np.ndarray, norm: np.ndarray) -> np.ndarray:
    """idf * tf * (k1 + 1) / (tf + norm) in float32, the same operations in the same order as that
    expression, but in two buffers instead of five: a common term of a long conversation holds tens of
    thousands of items. `norm` (a gathered copy) is overwritten."""
    part = frequencies.astype(np.float32)
    np.add(part, norm, out=norm)  # tf + norm
    np.multiply(part, np.float32(idf), out=part)
    np.multiply(part, np.float32(K1 + 1), out=part)
    quotient: np.ndarray = np.divide(part, norm, out=part)
    return quotient


class Vectors:
    """The vectors of some items (normalised, of one embedding model), scored by cosine similarity with a
    query through one matrix. The matrix grows in place as vectors are added (a row per item, in the order
    items first got a vector), so a vector appended after a search costs one row, not a rebuild of the
    whole matrix. Rows in full blocks of prescan.BLOCK_ROWS are scored
    first in int8 (retrieval.prescan), the best prescan.RESCORE_ROWS of them again exactly; the rows after
    the last full block exactly.

    The matrix is the only copy a vector keeps once written: a vector given to the table is held (with
    whatever buffer it is a view of, e.g. a database row's blob) only until the next search writes it: a
    second copy of each beside the matrix made a long conversation's index much larger."""

    def __init__(self) -> None:
        self.model = ""
        self._forget()

    def _forget(self) -> None:
        self._count = 0  # items with a vector, written or pending
        self._sum: np.ndarray | None = None  # of every item's vector, for mean()
        self._row: dict[int, int] = {}  # item -> its row in the matrix
        self._keys = array("q")  # row -> item
        self._buffer: np.ndarray | None = None  # rows beyond len(self._keys) are spare capacity
        self._pending: dict[int, np.ndarray] = {}  # vectors still to be written to their rows, in order
        self._dense = True  # row i holds item i for every row: scores are written without a scatter
        self._blocks: list[prescan.Int8Block | None] = []  # int8 copies of the full blocks of rows

    def __len__(self) -> int:
        return self._count

    def __setitem__(self, position: int, vector: np.ndarray) -> None:
        old = self.get(position)
        if old is None:
            self._count += 1
        if self._sum is None or len(self._sum) != len(vector):
            self._sum = np.zeros(len(vector), dtype=np.float64)
        elif old is not None and len(old) == len(vector):
            self._sum -= old
        self._sum += vector
        self._pending[position] = vector

    def mean(self) -> np.ndarray | None:
        """The mean of the items' vectors (None without any): what they all have in common."""
        if self._sum is None or not self._count:
            return None
        return (self._sum / self._count).astype(np.float32)

    def get(self, position: int) -> np.ndarray | None:
        """The item's vector, None when it has none: once written, a view of its row, which a later write of
        the same item changes (read it at once, or copy it)."""
        pending = self._pending.get(position)
        if pending is not None:
            return pending
        row = self._row.get(position)
        return None if row is None or self._buffer is None else self._buffer[row]

    def cosines(self, items: list[int], query_vector: np.ndarray | None) -> list[float]:
        """The exact cosine of each item with the query, to 4 places (0.0: no vector, or one of another
        dimension), from one product over their rows: a search reports it for hundreds of hits."""
        out = [0.0] * len(items)
        if query_vector is None or not self._count:
            return out
        matrix = self._matrix()
        if matrix.shape[1] != len(query_vector):
            return out
        rows = [self._row.get(item, -1) for item in items]
        found = [n for n, row in enumerate(rows) if row >= 0]
        if found:
            products = matrix[[rows[n] for n in found]] @ np.asarray(query_vector, dtype=np.float32)
            for n, product in zip(found, products.tolist(), strict=True):
                out[n] = round(product, 4)
        return out

    def use_model(self, model: str) -> None:
        """Vectors of another model do not compare with this one's: a change of model forgets them all."""
        if model != self.model:
            self.model = model
            self._forget()

    def similarity(
        self,
        query_vector: np.ndarray | None,
        size: int,
        shift: float = 0.0,
        *,
        helper: Executor | None = None,
    ) -> np.ndarray:
        """Cosine of each of `size` items with the query (0: no vector, or one of another dimension), plus
        `shift` for every item that has a vector (so that all of those are positive for ranks() when the query
        is not a unit vector, e.g. a centred one). With a `helper`, a thread of it scans int8 blocks too."""
        scores = np.zeros(size, dtype=np.float32)
        if query_vector is None or not self._count:
            return scores
        matrix = self._matrix()
        if matrix.shape[1] != len(query_vector):
            return scores
        query = np.asarray(query_vector, dtype=np.float32)
        if self._dense and len(matrix) <= size:
            self._row_scores(matrix, query, out=scores[: len(matrix)], helper=helper)
            scores[: len(matrix)] += np.float32(shift)
        else:
            rows = self._row_scores(matrix, query, out=np.empty(len(matrix), dtype=np.float32), helper=helper)
            scores[np.frombuffer(self._keys, dtype=np.int64)] = rows + np.float32(shift)
        return scores

    def _row_scores(
        self, matrix: np.ndarray, query: np.ndarray, *, out: np.ndarray, helper: Executor | None
    ) -> np.ndarray:
        """The cosine of every row with the query into `out`: the rows of full blocks by their int8 copies,
        the best RESCORE_ROWS of those again in float32, the rest of the rows in float32."""
        blocks = self._int8_blocks(matrix)
        sealed = len(blocks) * prescan.BLOCK_ROWS
        _scan_blocks(blocks, query, out, helper)
        if sealed > prescan.RESCORE_ROWS:
            best = best_positions(out[:sealed], prescan.RESCORE_ROWS)
            out[best] = matrix[best] @ query
        elif sealed:
            np.matmul(matrix[:sealed], query, out=out[:sealed])
        np.matmul(matrix[sealed:], query, out=out[sealed:])
        return out

    def _int8_blocks(self, matrix: np.ndarray) -> list[prescan.Int8Block]:
        """The int8 copies of the matrix's full blocks, built for blocks that have none (new, or a row of
        theirs was written again); none at all when one cannot be built (all rows are then exact)."""
        full = len(matrix) // prescan.BLOCK_ROWS
        self._blocks += [None] * (full - len(self._blocks))
        for number in range(full):
            if self._blocks[number] is None:
                rows = matrix[number * prescan.BLOCK_ROWS : (number + 1) * prescan.BLOCK_ROWS]
                self._blocks[number] = prescan.int8_block(rows)
                if self._blocks[number] is None:
                    return []
        return [block for block in self._blocks[:full] if block is not None]

    def _matrix(self) -> np.ndarray:
        """The rows written so far, after writing the pending ones (new items get the next rows)."""
        if self._pending:
            pending = list(self._pending)
            block = np.stack([self._pending[p] for p in pending])  # raises when dimensions differ
            new = [p for p in pending if p not in self._row]
            buffer = self._grow(len(new), block.shape[1])
            for position in new:
                self._row[position] = len(self._keys)
                self._dense = self._dense and position == len(self._keys)
                self._keys.append(position)
            rows = [self._row[p] for p in pending]
            buffer[rows] = block
            for number in {row // prescan.BLOCK_ROWS for row in rows}:
                if number < len(self._blocks):
                    self._blocks[number] = None  # rows written again: its int8 copy is out of date
            self._pending = {}
        assert self._buffer is not None
        return self._buffer[: len(self._keys)]

    def _grow(self, extra: int, dimension: int) -> np.ndarray:
        """The buffer, with room for `extra` more rows (a quarter more than needed when it moves, so that
        appends one turn at a time copy the matrix rarely)."""
        needed = len(self._keys) + extra
        if self._buffer is None or len(self._buffer) < needed:
            capacity = needed + (needed // 4 if self._buffer is not None else 0)
            buffer = np.empty((capacity, dimension), dtype=np.float32)
            if self._buffer is not None:
                if self._buffer.shape[1] != dimension:
                    raise ValueError("vectors of different dimensions in one table")
                buffer[: len(self._keys)] = self._buffer[: len(self._keys)]
            self._buffer = buffer
        return self._buffer


def _scan_blocks(
    blocks: list[prescan.Int8Block], query: np.ndarray, out: np.ndarray, helper: Executor | None
) -> None:
    """Each int8 block's scores into its rows of `out`. With a helper, this thread and one of the helper's
    take the next unscanned block in turn until none is left (on 2 cores: a 100,000-message conversation's
    14 blocks in about half the time). A helper thread not yet started when this one is done is not
    waited for."""
    taken = iter(range(len(blocks)))
    lock = threading.Lock()

    def scan() -> None:
        while True:
            with lock:
                number = next(taken, None)
            if number is None:
                return
            start = number * prescan.BLOCK_ROWS
            out[start : start + prescan.BLOCK_ROWS] = blocks[number].scores(query)

    other = helper.submit(scan) if helper is not None and len(blocks) > 1 else None
    scan()
    if other is not None and not other.cancel():
        other.result()


# From how many stored vectors the int8 blocks of a scan are shared with a helper thread (both_scores).
OVERLAP_VECTORS = 2 * prescan.BLOCK_ROWS
_helper: ThreadPoolExecutor | None = None
_helper_lock = threading.Lock()


def both_scores(
    postings: Postings,
    vectors: Vectors,
    query_terms: list[str],
    query_vector: "np.ndarray | Callable[[], np.ndarray | None] | None",
    size: int,
    shift: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(BM25 scores, cosine similarities plus `shift`, see Vectors.similarity) of the first `size` items.
    `query_vector` may be a function returning it, called after the BM25 pass: a question still being
    embedded on another thread (providers.embeddings.embed_query_ahead) is then embedded while BM25 runs,
    not before it. With many vectors their int8 blocks are scanned on this thread and a helper thread at once
    (onnxruntime releases the GIL); below OVERLAP_VECTORS handing blocks over would cost more than it saves.
    The caller holds the index's lock throughout."""
    lexical = postings.bm25(query_terms)
    vector = query_vector() if callable(query_vector) else query_vector
    helper = _scan_helper() if vector is not None and len(vectors) >= OVERLAP_VECTORS else None
    return lexical, vectors.similarity(vector, size, shift, helper=helper)


def _scan_helper() -> ThreadPoolExecutor:
    global _helper
    with _helper_lock:
        if _helper is None:
            # A few workers: concurrent requests on different indexes should not queue behind one scan.
            _helper = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mnemo-vector-scan")
        return _helper


def ranks(scores: np.ndarray, eligible: np.ndarray, depth: int) -> np.ndarray:
    """1-based rank of each item among the eligible ones with a positive score, for the best `depth`
    (0: unranked). Equal scores keep the order of their positions."""
    out = np.zeros(len(scores), dtype=np.int64)
    candidates = best_positions(scores, depth, eligible & (scores > 0))
    order = candidates[np.argsort(-scores[candidates], kind="stable")]
    out[order] = np.arange(1, len(order) + 1)
    return out


# A large array's best few are looked for among the values above a threshold read off a strided sample of
# this many values per one wanted (at most a few thousand in all).
SAMPLE_PER_BEST = 16


def best_positions(values: np.ndarray, count: int, where: np.ndarray | None = None) -> np.ndarray:
    """Positions of the `count` largest values (among those `where` holds; all of them when fewer), in no
    particular order. In a large array only the values above a threshold are partitioned: the threshold
    that a strided sample puts at about twice `count` (much cheaper than partitioning all of them); when
    fewer than `count` of the allowed values pass it, all of them are."""
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    allowed = np.ones(len(values), dtype=bool) if where is None else where
    candidates = None
    if len(values) > 8 * count:
        step = max(1, len(values) // (SAMPLE_PER_BEST * count))
        sample = values[::step]
        wanted = min(len(sample), max(1, 2 * count // step))
        threshold = np.partition(sample, len(sample) - wanted)[len(sample) - wanted]
        passed = np.flatnonzero(allowed & (values >= threshold))
        candidates = passed if len(passed) >= count else None
    if candidates is None:
        candidates = np.flatnonzero(allowed)
    if len(candidates) > count:
        candidates = candidates[np.argpartition(-values[candidates], count - 1)[:count]]
    return candidates


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
