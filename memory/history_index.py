"""Whole-history retrieval over one conversation: every passage (providers.passages) of every message is a
candidate, ranked by BM25 over the conversation's passages and by cosine similarity of the local embedding
vectors (conversations.MessageVector), fused with reciprocal rank fusion.

The index lives in this process, one per conversation (least recently used ones are dropped), and is brought
up to date on every call by reading only what was appended since it last looked: a query costs numpy work
proportional to the postings of its terms, never a scan of the table and never a newest-first shortcut.
Several server processes each keep their own copy; the database stays the only truth."""

import math
import re
import threading
import uuid
from array import array
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import numpy as np
import snowballstemmer
from django.conf import settings

from conversations.models import Message, MessageVector
from providers.embeddings import embedder_status, from_bytes
from providers.passages import passage_spans
from providers.text import CJK, PASSAGE_STOPWORDS

K1 = 1.2
B = 0.75
RRF_K = 60
_TERM = re.compile(rf"[{CJK}]+|[^\W_{CJK}]+")
_stemmer = snowballstemmer.stemmer("english")


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    return _stemmer.stemWord(word)


def terms(text: str) -> list[str]:
    """BM25 terms: lower-cased runs of letters or digits (an identifier's parts separately), English stems,
    no stopwords; CJK runs as characters and bigrams."""
    out: list[str] = []
    for word in _TERM.findall(text.lower()):
        if word[0] >= "\u3040" and re.match(rf"[{CJK}]", word):
            out.extend(word)
            out.extend(word[i : i + 2] for i in range(len(word) - 1))
        elif word not in PASSAGE_STOPWORDS and (len(word) > 1 or word.isdigit()):
            out.append(_stem(word) if word.isalpha() else word)
    return out


@dataclass
class Passage:
    message: int  # position of its message in the index
    start: int
    end: int


@dataclass
class IndexedMessage:
    id: str
    seq: int
    role: str
    created_at: datetime
    token_count: int
    completed: bool
    passages: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class PassageHit:
    message: IndexedMessage
    start: int
    end: int
    score: float  # fused (RRF over the lexical and the vector ranking)
    lexical: float  # BM25 of the passage as a share of the query's ceiling (0: no shared term)
    similarity: float  # cosine of the passage vector with the query (0: no vector)


class ConversationIndex:
    """The passages of one conversation with BM25 postings and, where computed, their vectors."""

    def __init__(self, conversation_id: Any) -> None:
        self.conversation_id = conversation_id
        self.messages: list[IndexedMessage] = []
        self.by_seq: dict[int, int] = {}
        self.passages: list[Passage] = []
        self.lengths = array("i")
        self.passage_owner = array("i")  # passage -> position of its message
        self.message_seqs = array("q")
        self.postings: dict[str, tuple[array, array]] = {}
        self.indexed_seq = 0
        self.incomplete: set[int] = set()
        self.vector_model = ""
        self.vectors: dict[int, np.ndarray] = {}  # passage -> vector
        self.missing_vectors: set[int] = set()  # message positions without vectors yet
        self._matrix: tuple[np.ndarray, np.ndarray] | None = None
        self._norm: np.ndarray | None = None
        self.lock = threading.Lock()

    # --- keeping up ---------------------------------------------------------------------------------------

    def sync(self) -> None:
        rows = (
            Message.objects.filter(
                conversation_id=self.conversation_id, kind=Message.Kind.MESSAGE, seq__gt=self.indexed_seq
            )
            .order_by("seq")
            .values_list("id", "seq", "role", "content", "token_count", "created_at", "completed")
        )
        for row in rows.iterator(chunk_size=2000):
            self._add(*row)
        self._sync_vectors()

    def stale(self) -> bool:
        """An incomplete (streamed, cut off) message was amended or completed since it was indexed."""
        if not self.incomplete:
            return False
        seqs = [self.messages[i].seq for i in self.incomplete]
        done = Message.objects.filter(
            conversation_id=self.conversation_id, seq__in=seqs, completed=True
        ).exists()
        return done

    def _add(self, pk: Any, seq: int, role: str, content: str, tokens: int, created: Any, done: bool) -> None:
        position = len(self.messages)
        message = IndexedMessage(str(pk), seq, role, created, tokens, done)
        for start, end in passage_spans(content):
            counts = Counter(terms(content[start:end]))
            index = len(self.passages)
            self.passages.append(Passage(position, start, end))
            self.lengths.append(sum(counts.values()))
            self.passage_owner.append(position)
            for term, tf in counts.items():
                posting = self.postings.get(term)
                if posting is None:
                    posting = self.postings[term] = (array("i"), array("i"))
                posting[0].append(index)
                posting[1].append(tf)
            message.passages.append(index)
        self.messages.append(message)
        self.message_seqs.append(seq)
        self.by_seq[seq] = position
        self.indexed_seq = max(self.indexed_seq, seq)
        if not done:
            self.incomplete.add(position)
        self.missing_vectors.add(position)

    def _sync_vectors(self) -> None:
        embedder = embedder_status().embedder
        if embedder is None or not self.missing_vectors:
            return
        if embedder.name != self.vector_model:
            self.vector_model, self.vectors, self._matrix = embedder.name, {}, None
        floor = min(self.messages[i].seq for i in self.missing_vectors)
        rows = MessageVector.objects.filter(
            conversation_id=self.conversation_id, model=embedder.name, seq__gte=floor
        ).values_list("seq", "spans", "vectors", "dimension")
        for seq, spans, blob, dimension in rows.iterator(chunk_size=2000):
            position = self.by_seq.get(seq)
            if position is None or position not in self.missing_vectors:
                continue
            matrix = from_bytes(blob).reshape(-1, dimension) if dimension else np.zeros((0, 0))
            starts = {self.passages[p].start: p for p in self.messages[position].passages}
            for (start, _end), vector in zip(spans, matrix, strict=False):
                if start in starts:
                    self.vectors[starts[start]] = vector
            self.missing_vectors.discard(position)
            self._matrix = None

    # --- ranking ----------------------------------------------------------------------------------------

    def _length_norm(self) -> np.ndarray:
        """BM25's per-passage length term, computed again only when passages were added."""
        if self._norm is None or len(self._norm) != len(self.passages):
            lengths = np.frombuffer(self.lengths, dtype=np.int32).astype(np.float32)
            self._norm = K1 * (1 - B + B * lengths / max(float(lengths.mean()), 1.0))
        return self._norm

    def bm25(self, query_terms: list[str]) -> np.ndarray:
        """BM25 of every passage, as a share of the most the query's terms could score (each term's IDF
        times k1 + 1): 1.0 would be every word of the question, each many times; a passage holding only the
        common words of a question scores near 0, whatever the corpus."""
        count = len(self.passages)
        scores = np.zeros(count, dtype=np.float32)
        if not count:
            return scores
        ceiling = 0.0
        norm = self._length_norm()
        for term in set(query_terms):
            posting = self.postings.get(term)
            if posting is None:
                continue
            where = np.frombuffer(posting[0], dtype=np.int32)
            tf = np.frombuffer(posting[1], dtype=np.int32).astype(np.float32)
            idf = math.log(1 + (count - len(where) + 0.5) / (len(where) + 0.5))
            scores[where] += idf * tf * (K1 + 1) / (tf + norm[where])
            ceiling += idf * (K1 + 1)
        return scores / ceiling if ceiling else scores

    def similarity(self, query_vector: np.ndarray | None) -> np.ndarray:
        scores = np.zeros(len(self.passages), dtype=np.float32)
        if query_vector is None or not self.vectors:
            return scores
        if self._matrix is None:
            keys = np.fromiter(self.vectors.keys(), dtype=np.int64, count=len(self.vectors))
            self._matrix = (keys, np.vstack([self.vectors[k] for k in keys.tolist()]).astype(np.float32))
        keys, matrix = self._matrix
        scores[keys] = matrix @ query_vector.astype(np.float32)
        return scores


def _ranks(scores: np.ndarray, eligible: np.ndarray, depth: int) -> np.ndarray:
    """1-based rank of each passage among the eligible ones with a positive score (0: unranked), for the
    best `depth`."""
    ranks = np.zeros(len(scores), dtype=np.int64)
    candidates = np.flatnonzero(eligible & (scores > 0))
    if not len(candidates):
        return ranks
    if len(candidates) > depth:
        top = np.argpartition(-scores[candidates], depth - 1)[:depth]
        candidates = candidates[top]
    order = candidates[np.argsort(-scores[candidates], kind="stable")]
    ranks[order] = np.arange(1, len(order) + 1)
    return ranks


# How deep each ranking goes into the fusion, and what each ranking weighs in it.
FUSION_DEPTH = 200
LEXICAL_WEIGHT = 1.0
VECTOR_WEIGHT = 1.5


def search(
    index: ConversationIndex, *, query: str, query_vector: np.ndarray | None, before_seq: int, limit: int
) -> list[PassageHit]:
    """The best `limit` passages of messages with seq <= before_seq, best first (fused score)."""
    if not index.passages:
        return []
    owner = np.frombuffer(index.passage_owner, dtype=np.int32)
    seqs = np.frombuffer(index.message_seqs, dtype=np.int64)
    eligible = seqs[owner] <= before_seq
    lexical = index.bm25(terms(query))
    similarity = index.similarity(query_vector)
    fused = np.zeros(len(index.passages), dtype=np.float64)
    rankings = ((LEXICAL_WEIGHT, lexical), (VECTOR_WEIGHT, similarity))
    for weight, scores in rankings:
        ranks = _ranks(scores, eligible, FUSION_DEPTH)
        ranked = ranks > 0
        fused[ranked] += weight / (RRF_K + ranks[ranked])
    best = np.flatnonzero(fused > 0)
    best = best[np.argsort(-fused[best], kind="stable")][:limit]
    return [
        PassageHit(
            message=index.messages[index.passages[i].message],
            start=index.passages[i].start,
            end=index.passages[i].end,
            score=round(float(fused[i]), 6),
            lexical=round(float(lexical[i]), 4),
            similarity=round(float(similarity[i]), 4),
        )
        for i in best.tolist()
    ]


# --- the per-process cache --------------------------------------------------------------------------------

_indexes: "OrderedDict[str, ConversationIndex]" = OrderedDict()
_indexes_lock = threading.Lock()


def conversation_index(conversation_id: uuid.UUID | str) -> ConversationIndex:
    """The conversation's index, up to date with the database."""
    key = str(conversation_id)
    with _indexes_lock:
        index = _indexes.get(key)
        if index is not None:
            _indexes.move_to_end(key)
        else:
            index = _indexes[key] = ConversationIndex(conversation_id)
            while len(_indexes) > settings.MNEMO_RECALL_INDEX_CONVERSATIONS:
                _indexes.popitem(last=False)
    with index.lock:
        stale = index.stale()
    if stale:
        index = ConversationIndex(conversation_id)
        with _indexes_lock:
            _indexes[key] = index
    with index.lock:
        index.sync()
    return index


def conversation_index_drop(conversation_id: uuid.UUID | str) -> None:
    with _indexes_lock:
        _indexes.pop(str(conversation_id), None)


def conversation_index_warm(conversation_id: uuid.UUID | str) -> None:
    """After background work wrote to a conversation (its vectors): where that work runs in the serving
    process (the embedded mode runs tasks on a thread of the server), bring the conversation's index up to
    date there, so the next context call does not pay for reading and indexing what was appended since
    (for a conversation it has not served yet, the whole of it). A Celery worker has no index to keep."""
    if settings.CELERY_TASK_ALWAYS_EAGER:
        conversation_index(conversation_id)
