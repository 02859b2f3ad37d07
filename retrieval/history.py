"""Whole-history retrieval over one conversation: every passage (providers.passages) of every message is a
candidate, ranked by BM25 over the conversation's passages and by cosine similarity of the local embedding
vectors (conversations.MessageVector), fused with reciprocal rank fusion.

The index lives in this process, one per conversation (least recently used ones are dropped), and is brought
up to date on every call by reading only what was appended since it last looked: a query costs numpy work
proportional to the postings of its terms, never a scan of the table and never a newest-first shortcut.
Several server processes each keep their own copy; the database stays the only truth."""

import gc
import re
import threading
import uuid
from array import array
from bisect import bisect_right
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import numpy as np
import snowballstemmer
from django.conf import settings
from django.db.models import Subquery

from conversations.models import Conversation, Message, MessageVector
from providers.background import server_handler, server_notify
from providers.dates import Period, mentions
from providers.embeddings import embedder_status, from_bytes
from providers.passages import passage_spans
from providers.text import CJK, PASSAGE_STOPWORDS
from retrieval.ranking import Postings, Vectors, best_first, best_positions, both_scores, fuse
from tenants.statements import FixedQuery, Read

_TERM = re.compile(rf"[{CJK}]+|[^\W_{CJK}]+")
_stemmer = snowballstemmer.stemmer("english")


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    stem: str = _stemmer.stemWord(word)
    return stem


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
    name: str = ""  # the speaker, when the client named one
    # The periods its relative expressions name ("yesterday", "last month"), resolved against created_at.
    periods: tuple[Period, ...] = ()


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
        self.postings = Postings()  # BM25 over the passages
        self.message_seqs = array("q")
        self.message_first_passage = array("i")  # per message position: its first passage (or the next's)
        self.passage_from_user = array("b")  # per passage: 1 when the user said its message
        self.passage_message = array("i")  # per passage: its message's position
        self.message_day = array("i")  # per message: the proleptic ordinal of the day it was said
        self.speakers: dict[str, int] = {}  # a speaker's case-folded name -> its number
        self.passage_speaker = array("i")  # per passage: its speaker's number (-1: no name)
        self.names: dict[str, str] = {}  # case-folded -> as written, every named speaker
        self.dated: list[int] = []  # positions of the messages whose text names a relative period
        self.tokens = 0  # of every message indexed
        self.indexed_seq = 0
        self.incomplete: set[int] = set()
        self.vectors = Vectors()  # of the passages that have one
        self.missing_vectors: set[int] = set()  # message positions without vectors yet
        self.lock = threading.Lock()

    # --- keeping up ---------------------------------------------------------------------------------------

    def sync(self) -> None:
        whole = not self.indexed_seq
        floor = self._vector_floor()  # taken before the new rows: catch_up_reads reads ahead with it
        if not whole:  # what was appended since the last call: a few rows, one fixed statement
            query, values = self._new_messages_read()
            rows = query.run(**values)
        else:  # the whole history, in chunks
            rows = _new_messages(self.conversation_id, 0).iterator(chunk_size=2000)
        added = len(self.messages)
        for row in rows:
            self._add(*row)
        self._sync_vectors(floor)
        if whole and self.indexed_seq:
            keep_out_of_collections()
        elif len(self.messages) > added:
            _caught_up(len(self.messages) - added)

    def catch_up_reads(self) -> list[Read]:
        """The fixed reads the next sync makes (the messages appended since, the vectors still missing), for
        reading them ahead with a call's other small reads (tenants.statements.read_ahead): two round trips
        fewer for a call that follows appends. None before the first, whole read. Rows read ahead and not
        asked for (another call synced meanwhile, a backlog read in chunks instead) are left unused."""
        if not self.indexed_seq:
            return []
        reads = [self._new_messages_read()]
        embedder = embedder_status().embedder
        if embedder is not None and len(self.missing_vectors) <= FIXED_VECTOR_READ:
            reads.append(self._new_vectors_read(embedder.name, self._vector_floor()))
        return reads

    # The one spelling of the two fixed statements sync makes, which catch_up_reads lists to read them ahead.
    def _new_messages_read(self) -> Read:
        return _NEW_MESSAGES, {"conversation_id": self.conversation_id, "after": self.indexed_seq}

    def _new_vectors_read(self, model: str, floor: int) -> Read:
        return _NEW_VECTORS, {"conversation_id": self.conversation_id, "model": model, "floor": floor}

    def _vector_floor(self) -> int:
        """The lowest seq whose vectors a sync may still have to read: its oldest message without them, else
        the first seq after what is indexed (the messages it is about to add). Positions follow seq (sync
        appends in seq order): min() over the ints, not a generator over the messages, which cost every call
        time in proportion to the backlog."""
        after = self.indexed_seq + 1
        return min(self.messages[min(self.missing_vectors)].seq, after) if self.missing_vectors else after

    def stale(self) -> bool:
        """An incomplete (streamed, cut off) message was amended or completed since it was indexed."""
        if not self.incomplete:
            return False
        seqs = [self.messages[i].seq for i in self.incomplete]
        done = Message.objects.filter(
            conversation_id=self.conversation_id, seq__in=seqs, completed=True
        ).exists()
        return done

    def _add(
        self, pk: Any, seq: int, role: str, name: str, content: str, tokens: int, created: Any, done: bool
    ) -> None:
        position = len(self.messages)
        periods = tuple(m.period for m in mentions(content, created.date()))
        message = IndexedMessage(str(pk), seq, role, created, tokens, done, name=name, periods=periods)
        speaker = self._speaker(name)
        self.message_first_passage.append(len(self.passages))
        for start, end in passage_spans(content):
            message.passages.append(len(self.passages))
            self.passages.append(Passage(position, start, end))
            self.postings.add(Counter(terms(content[start:end])))
            self.passage_from_user.append(role == Message.Role.USER)
            self.passage_message.append(position)
            self.passage_speaker.append(speaker)
        if periods:
            self.dated.append(position)
        self.message_day.append(created.date().toordinal())
        self.tokens += tokens
        self.messages.append(message)
        self.message_seqs.append(seq)
        self.by_seq[seq] = position
        self.indexed_seq = max(self.indexed_seq, seq)
        if not done:
            self.incomplete.add(position)
        self.missing_vectors.add(position)

    def _speaker(self, name: str) -> int:
        if not name:
            return -1
        key = name.casefold()
        self.names.setdefault(key, name)
        return self.speakers.setdefault(key, len(self.speakers))

    def _sync_vectors(self, floor: int) -> None:
        """The vectors of the messages still without them, from `floor` (_vector_floor) on."""
        embedder = embedder_status().embedder
        if embedder is None or not self.missing_vectors:
            return
        self.vectors.use_model(embedder.name)
        if len(self.missing_vectors) <= FIXED_VECTOR_READ:
            query, values = self._new_vectors_read(embedder.name, floor)
            rows = query.run(**values)
        elif _ANY_NEW_VECTOR.run(conversation_id=self.conversation_id, model=embedder.name, floor=floor):
            # A backlog (a first read, vectors still being computed): in chunks, through a server-side
            # cursor. Only when there is something to read: with vectors off on append, or a worker behind,
            # every call would pay for opening that cursor to find nothing.
            rows = _new_vectors(self.conversation_id, embedder.name, floor).iterator(chunk_size=2000)
        else:
            return
        for seq, spans, blob, dimension in rows:
            position = self.by_seq.get(seq)
            if position is None or position not in self.missing_vectors:
                continue
            matrix = from_bytes(blob).reshape(-1, dimension) if dimension else np.zeros((0, 0))
            starts = {self.passages[p].start: p for p in self.messages[position].passages}
            for (start, _end), vector in zip(spans, matrix, strict=False):
                if start in starts:
                    self.vectors[starts[start]] = vector
            self.missing_vectors.discard(position)


# Catch-up reads add a few messages at a time, and their objects pile up where full collections walk them:
# once this many have been added in the process since the last freeze, they are frozen too
# (keep_out_of_collections), so that no full collection walks more than about this many messages' objects.
FREEZE_EVERY_MESSAGES = 1000
_unfrozen = [0]  # messages added by catch-up reads since the last freeze, in this process
_unfrozen_lock = threading.Lock()


def _caught_up(messages: int) -> None:
    """Count messages a catch-up read added; freeze them (and all else alive) every FREEZE_EVERY_MESSAGES."""
    with _unfrozen_lock:
        _unfrozen[0] += messages
        if _unfrozen[0] < FREEZE_EVERY_MESSAGES:
            return
    keep_out_of_collections()


def keep_out_of_collections() -> None:
    """Move what this process holds now out of the cyclic garbage collector's view (gc.freeze): an index is
    tens of thousands of long-lived objects, and each full collection walked all of them: a pause on one
    call, and slower calls throughout, growing with the number of indexes held. A full collection first:
    garbage frozen would never be collected, and a cycle holding an open database cursor kept SQLite's table
    locked for every other connection. It walks only what is not frozen yet, so after the first index it is
    short. Frozen objects are still freed when nothing refers to them (an index dropped from the cache goes
    as before)."""
    with _unfrozen_lock:
        _unfrozen[0] = 0
    gc.collect()
    gc.freeze()


def _last_seq(conversation_id: Any) -> Subquery:
    """The conversation's last_seq, as an upper bound for a read of its newest rows by seq. PostgreSQL
    estimates `seq > n` from the whole table's seq histogram, where long conversations' high seqs are most
    rows: it took that for most of the conversation and read all of it by its foreign key instead of the
    (conversation, seq) range, a cost growing with the conversation for no new row. A bound it cannot read
    while planning keeps the range estimate small; every seq is at most last_seq (conversations.services
    allocates them from it)."""
    return Subquery(Conversation.objects.filter(pk=conversation_id).values("last_seq")[:1])


def _new_messages(conversation_id: Any, after: int) -> Any:
    return (
        Message.objects.filter(
            conversation_id=conversation_id,
            kind=Message.Kind.MESSAGE,
            seq__gt=after,
            seq__lte=_last_seq(conversation_id),
        )
        .order_by("seq")
        .values_list("id", "seq", "role", "name", "content", "token_count", "created_at", "completed")
    )


def _new_vectors(conversation_id: Any, model: str, floor: int) -> Any:
    return MessageVector.objects.filter(
        conversation_id=conversation_id, model=model, seq__gte=floor, seq__lte=_last_seq(conversation_id)
    ).values_list("seq", "spans", "vectors", "dimension")


# Every context call brings its conversation's index up to date: once it has been read whole, these read only
# what is new, as statements compiled once (tenants.statements). Up to this many messages still without
# vectors are read in one go; a longer backlog in chunks.
_NEW_MESSAGES = FixedQuery(_new_messages, conversation_id=uuid.UUID(int=0x1D5), after=7_123_456_789_011)
_NEW_VECTORS = FixedQuery(
    _new_vectors,
    conversation_id=uuid.UUID(int=0x1D6),
    model="fixed-query-sample-model",
    floor=7_123_456_789_013,
)
_ANY_NEW_VECTOR = FixedQuery(
    lambda conversation_id, model, floor: _new_vectors(conversation_id, model, floor).values_list("seq")[:1],
    conversation_id=uuid.UUID(int=0x1D7),
    model="fixed-query-sample-model",
    floor=7_123_456_789_017,
)
FIXED_VECTOR_READ = 500


# How deep each ranking goes into the fusion (at least as deep as the hits asked for: a room of short turns
# asks for more than this), and what each ranking weighs in it.
FUSION_DEPTH = 200
LEXICAL_WEIGHT = 1.0
VECTOR_WEIGHT = 1.5
# Each ranking ranks messages (their best passage), not passages: a long reply's many passages would
# otherwise fill the fusion depth and push short messages, whoever said them, out of both rankings.
# A message ranking is read among this many times the fusion depth of best passages (a message with more
# passages than that among them only loses places it could not have used).
MESSAGE_RANKING_READ = 4
# The vector ranking compares the passages with the question less CENTRING times the mean of the
# conversation's passage vectors: what every message of a long conversation shares (its project, its
# subject) stops deciding which passages come first, and the part of the question that tells them apart
# does. The cosines reported (PassageHit.similarity, the relevance a client reads) stay those with the
# question itself. Removing the whole mean took more than it gave (docs/benchmarks.md holds the figures).
CENTRING = 0.5
# Centred cosines may be negative, and ranks() takes positive scores only: each passage that has a vector
# is ranked by its centred cosine plus this (the largest a centred cosine can fall below zero is 1.5).
CENTRED_SHIFT = 2.0


# A preference: which passages (a boolean mask over the index's passages, built under its lock) weigh how
# many times more in the fusion.
Preference = tuple[Callable[["ConversationIndex"], np.ndarray], float]


def search(
    index: ConversationIndex,
    *,
    query: str,
    query_vector: "np.ndarray | Callable[[], np.ndarray | None] | None",
    before_seq: int,
    limit: int,
    lexical_query: str | None = None,
    preferences: tuple[Preference, ...] = (),
) -> list[PassageHit]:
    """The best `limit` passages of messages with seq <= before_seq, best first (fused score, times the weight
    of each preference a passage meets: weighed before the best are chosen, so that a long reply's many
    passages cannot crowd the preferred ones out of the `limit`). BM25 ranks `lexical_query` when given (the
    question without what a preference already stands for), the vectors `query`. A function as
    `query_vector` is called once BM25 has scored the passages (retrieval.ranking.both_scores).

    Under the index's lock, as sync() is: another request's call on the same conversation may be adding
    passages and vectors meanwhile, and the postings' arrays cannot grow while numpy reads them."""
    with index.lock:
        return _search(index, lexical_query or query, query_vector, before_seq, limit, preferences)


def _search(
    index: ConversationIndex,
    query: str,
    query_vector: "np.ndarray | Callable[[], np.ndarray | None] | None",
    before_seq: int,
    limit: int,
    preferences: tuple[Preference, ...],
) -> list[PassageHit]:
    if not index.passages:
        return []
    eligible = np.zeros(len(index.passages), dtype=bool)
    eligible[: _passages_until(index, before_seq)] = True
    asked: list[np.ndarray | None] = []  # the question's own vector, for the cosines hits report

    def centred() -> np.ndarray | None:
        asked.append(query_vector() if callable(query_vector) else query_vector)
        return _centred(asked[0], index.vectors.mean())

    lexical, closeness = both_scores(
        index.postings, index.vectors, terms(query), centred, len(index.passages), shift=CENTRED_SHIFT
    )
    depth = max(FUSION_DEPTH, limit)
    owner = np.frombuffer(index.passage_message, dtype=np.int32)
    rankings = (
        (LEXICAL_WEIGHT, _best_of_each(lexical, owner, eligible, depth)),
        (VECTOR_WEIGHT, _best_of_each(closeness, owner, eligible, depth)),
    )
    fused = _to_best_of_each(fuse(rankings, eligible, depth), owner)
    for mask_of, weight in preferences:
        fused[mask_of(index)] *= weight
    return _hits(index, best_first(fused, limit), fused, lexical, asked[0])


def _hits(
    index: ConversationIndex,
    best: np.ndarray,
    fused: np.ndarray,
    lexical: np.ndarray,
    query_vector: np.ndarray | None,
) -> list[PassageHit]:
    """The passages at `best` as hits. The scores go to Python floats in one step each (tolist): hundreds of
    hits, each read as a numpy scalar, cost more than the ranking."""
    positions = best.tolist()
    passages = [index.passages[i] for i in positions]
    similarities = index.vectors.cosines(positions, query_vector)
    scores = zip(passages, fused[best].tolist(), lexical[best].tolist(), similarities, strict=True)
    return [
        PassageHit(
            message=index.messages[passage.message],
            start=passage.start,
            end=passage.end,
            score=round(score, 6),
            lexical=round(lexical_score, 4),
            similarity=similarity,
        )
        for passage, score, lexical_score, similarity in scores
    ]


def _best_of_each(scores: np.ndarray, owner: np.ndarray, eligible: np.ndarray, depth: int) -> np.ndarray:
    """Each message's best eligible passage keeps its score (the first of equals), its other passages none
    (`owner`: each passage's message): a ranking of messages, so that a long reply's many passages cannot fill
    the fusion depth and push short messages out of it. Read among the best few times `depth` passages only,
    not the whole conversation."""
    top = best_positions(scores, MESSAGE_RANKING_READ * depth, eligible & (scores > 0))
    order = top[np.argsort(-scores[top], kind="stable")]
    _, first = np.unique(owner[order], return_index=True)
    kept = order[first]
    out = np.zeros_like(scores)
    out[kept] = scores[kept]
    return out


def _to_best_of_each(fused: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """A message's fused score (the sum over its passages: its lexically best and its closest may differ) on
    its best passage alone."""
    scored = np.flatnonzero(fused > 0)
    order = scored[np.argsort(-fused[scored], kind="stable")]
    messages, first, inverse = np.unique(owner[order], return_index=True, return_inverse=True)
    totals = np.bincount(inverse, weights=fused[order], minlength=len(messages))
    out = np.zeros_like(fused)
    out[order[first]] = totals
    return out


def mean_passage_tokens(index: ConversationIndex) -> float:
    return index.tokens / len(index.passages) if index.passages else 1.0


def said_by(index: ConversationIndex, names: frozenset[str], *, user: bool = False) -> np.ndarray:
    """Per passage: said by one of the speakers `names` (case-folded) or, with `user`, in the user's role."""
    numbers = [index.speakers[n] for n in names if n in index.speakers]
    mask = np.isin(np.frombuffer(index.passage_speaker, dtype=np.int32), numbers)
    if user:
        mask |= np.frombuffer(index.passage_from_user, dtype=np.bool_)
    return mask


def said_in(index: ConversationIndex, period: Period) -> np.ndarray:
    """Per passage: its message was said in `period`, or names a period that overlaps it ("yesterday")."""
    days = np.frombuffer(index.message_day, dtype=np.int32)
    in_period = (days >= period.first.toordinal()) & (days <= period.last.toordinal())
    for position in index.dated:
        if any(period.overlaps(p.first, p.last) for p in index.messages[position].periods):
            in_period[position] = True
    return in_period[np.frombuffer(index.passage_message, dtype=np.int32)]


def _centred(query_vector: np.ndarray | None, mean: np.ndarray | None) -> np.ndarray | None:
    """The question's vector less CENTRING times the conversation's mean passage vector (see CENTRING)."""
    if query_vector is None or mean is None or len(mean) != len(query_vector):
        return query_vector
    return np.asarray(query_vector, dtype=np.float32) - np.float32(CENTRING) * mean


def _passages_until(index: ConversationIndex, seq: int) -> int:
    """How many passages belong to messages with a seq up to `seq`: passages are added in seq order, so
    those are a prefix (found by bisection, instead of comparing every passage's seq)."""
    messages = bisect_right(index.message_seqs, seq)
    if messages == len(index.messages):
        return len(index.passages)
    return index.message_first_passage[messages]


def lexical_shares(index: ConversationIndex, query: str, texts: list[str]) -> list[float]:
    """The lexical score a passage holding each text would get for `query` in this conversation (PassageHit's
    `lexical`): hits from elsewhere (archival memories) on the same scale as the history's."""
    query_terms, counts = terms(query), [Counter(terms(text)) for text in texts]
    with index.lock:  # as search()
        return [round(index.postings.share(query_terms, c), 4) for c in counts]


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


def index_catch_up_reads(conversation_id: uuid.UUID | str) -> list[Read]:
    """The catch-up reads of the conversation's index in this process (ConversationIndex.catch_up_reads);
    none when this process holds no index of it."""
    with _indexes_lock:
        index = _indexes.get(str(conversation_id))
    if index is None:
        return []
    with index.lock:
        return index.catch_up_reads()


def conversation_index_drop(conversation_id: uuid.UUID | str) -> None:
    with _indexes_lock:
        _indexes.pop(str(conversation_id), None)


def conversation_index_warm(conversation_id: uuid.UUID | str) -> None:
    """After background work wrote to a conversation (its vectors): where that work runs in the serving
    process (the embedded mode's MNEMO_EMBEDDED_WORKER=thread), bring the conversation's index up to
    date there, so the next context call does not pay for reading and indexing what was appended since
    (for a conversation it has not served yet, the whole of it). A Celery worker has no index to keep; the
    embedded worker process hands the work to the server it belongs to."""
    if server_notify("warm", str(conversation_id)):
        return
    if settings.CELERY_TASK_ALWAYS_EAGER:
        conversation_index(conversation_id)


server_handler("warm", conversation_index)
