"""Knowledge search: every chunk of a tenant's ready documents is a candidate, ranked three ways and fused
with reciprocal rank fusion (k = 60): BM25 over identifier-aware terms (knowledge.identifiers), trigram
similarity of the question to the chunk's symbol (pg_trgm on PostgreSQL when the extension is there, the
same measure computed here otherwise) and cosine similarity of the local embedding vectors.

The index lives in this process, one per tenant (least recently used ones dropped), and follows the
database by documents: a cheap fingerprint of the tenant's ready documents (count, chunks, newest) is read
on each search, and only when it moved are the new documents' chunks read and the deleted ones' masked.
Several server processes each keep their own copy; the database stays the only truth. With a vector engine
(MNEMO_VECTOR_STORE=milvus) the index holds no vectors: the engine ranks the chunks by similarity."""

import functools
import threading
import uuid
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Max, Sum

from knowledge.identifiers import looks_like_a_name, query_terms, symbol_words, terms, trigrams
from knowledge.models import Chunk, Document, scope_key
from providers.embeddings import embed_query, embedder_status, from_bytes
from retrieval.ranking import Postings, Vectors, best_first, both_scores, fuse
from retrieval.vectors.current import vector_engine
from retrieval.vectors.degraded import engine_unavailable
from retrieval.vectors.store import (
    VectorFilters,
    VectorHit,
    VectorScope,
    VectorStore,
    VectorStoreUnavailable,
)
from tenants.statements import FixedQuery, Read, list_samples, list_values

FUSION_DEPTH = 200
LEXICAL_WEIGHT = 1.0
VECTOR_WEIGHT = 1.0
# The local model reads English, not code: on a real code base its ranking lowered the code search's
# quality at every weight tried (bench/knowledge.py), so code chunks are ranked by words and symbols. Their
# vectors are still stored: a code-capable embedding model needs only this weight changed, not the
# repositories processed again.
CODE_VECTOR_WEIGHT = 0.0
SYMBOL_WEIGHT = 1.0
# Below this trigram similarity a symbol is not a fuzzy match (pg_trgm's own default let weak matches crowd
# out the lexical ranking on name queries).
SYMBOL_THRESHOLD = 0.45
KIND_CODES: dict[str, int] = {Document.Kind.DOCUMENT: 0, Document.Kind.CODE: 1}


# What tells a tenant's ready documents changed (count, chunks, last processed), read on every context
# call: a fixed statement (tenants.statements). Grouped by the tenant: no documents is no row.
_FINGERPRINT = FixedQuery(
    lambda tenant_id: (
        Document.objects.filter(tenant_id=tenant_id, status=Document.Status.READY)
        .order_by()
        .values("tenant_id")
        .annotate(n=Count("id"), c=Sum("chunk_count"), t=Max("processed_at"))
        .values_list("n", "c", "t")
    ),
    tenant_id=uuid.uuid4(),
)


def knowledge_reads(tenant_id: Any) -> list[Read]:
    """What tells whether the tenant's index is current, for reading it ahead (tenants.statements)."""
    return [(_FINGERPRINT, {"tenant_id": tenant_id})]


class KnowledgeIndex:
    """The chunks of one tenant's ready documents: BM25 postings, symbol trigram postings, vectors."""

    def __init__(self, tenant_id: Any, *, keeps_vectors: bool = True) -> None:
        self.tenant_id = tenant_id
        # False when a vector engine ranks the chunks: this process then holds no vectors of them.
        self.keeps_vectors = keeps_vectors
        self.fingerprint: tuple[Any, ...] | None = None
        self.documents: dict[str, list[int]] = {}  # document id -> its positions
        self.processed: dict[str, Any] = {}  # document id -> its processed_at when loaded
        self.chunk_ids = array("q")
        self.position_of: dict[int, int] = {}  # chunk id -> position
        self.scope_codes = array("i")
        self.kinds = array("b")
        self.alive = array("b")
        self.scopes: dict[str, int] = {}
        self.postings = Postings()  # BM25 over path, symbol, heading and content
        self.symbol_postings: dict[str, array[int]] = {}
        self.symbol_sizes = array("i")
        self.vectors = Vectors()
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.chunk_ids)

    # --- keeping up ---------------------------------------------------------------------------------------

    def sync(self) -> None:
        ready = Document.objects.filter(tenant_id=self.tenant_id, status=Document.Status.READY)
        fingerprint = _FINGERPRINT.first(tenant_id=self.tenant_id) or (0, None, None)
        if fingerprint == self.fingerprint:
            return
        current = {str(pk): processed for pk, processed in ready.values_list("id", "processed_at")}
        # Gone, or processed again since it was loaded (its chunks' vectors embedded again, say): its
        # positions die, and a document still ready is loaded anew.
        for stale in [d for d in self.documents if d not in current or self.processed.get(d) != current[d]]:
            for position in self.documents.pop(stale):
                self.alive[position] = 0
            self.processed.pop(stale, None)
        new = set(current) - set(self.documents)
        if new:
            self._load(new)
            self.processed.update((d, current[d]) for d in new)
        self.fingerprint = fingerprint

    def _load(self, document_ids: set[str]) -> None:
        self.vectors.use_model(getattr(embedder_status().embedder, "name", ""))
        # Without vectors kept here, the embeddings are not even read.
        vector_fields = ("embedding", "embedding_model") if self.keeps_vectors else ()
        rows = (
            Chunk.objects.filter(document_id__in=document_ids)
            .order_by("document_id", "ordinal")
            .values_list(
                "id", "document_id", "scope_key", "kind", "path", "symbol", "heading", "content",
                *vector_fields,
            )
        )  # fmt: skip
        for row in rows.iterator(chunk_size=1000):
            self._add(*row)
        for document_id in document_ids:
            self.documents.setdefault(document_id, [])

    def _add(self, pk: int, document_id: Any, scope: str, kind: str, path: str, symbol: str, heading: str,
             content: str, embedding: Any = None, model: str = "") -> None:  # fmt: skip
        position = len(self.chunk_ids)
        self.documents.setdefault(str(document_id), []).append(position)
        self.chunk_ids.append(pk)
        self.position_of[pk] = position
        self.scope_codes.append(self.scopes.setdefault(scope, len(self.scopes)))
        self.kinds.append(KIND_CODES.get(kind, 0))
        self.alive.append(1)
        self.postings.add(Counter(terms(f"{path}\n{symbol}\n{heading}\n{content}")))
        grams = trigrams(symbol_words(symbol)) if symbol else frozenset()
        self.symbol_sizes.append(len(grams))
        for gram in grams:
            self.symbol_postings.setdefault(gram, array("i")).append(position)
        if embedding is not None and model == self.vectors.model:
            self.vectors[position] = from_bytes(embedding)

    # --- ranking ----------------------------------------------------------------------------------------

    def symbol_similarity(self, query: str) -> np.ndarray:
        """pg_trgm's similarity of the question's words to each chunk's symbol words."""
        scores = np.zeros(len(self.chunk_ids), dtype=np.float32)
        grams = trigrams(symbol_words(query))
        if not grams or not scores.size:
            return scores
        overlap = np.zeros(len(self.chunk_ids), dtype=np.float32)
        for gram in grams:
            posting = self.symbol_postings.get(gram)
            if posting is not None:
                overlap[np.frombuffer(posting, dtype=np.int32)] += 1
        sizes = np.frombuffer(self.symbol_sizes, dtype=np.int32).astype(np.float32)
        hit = overlap > 0
        scores[hit] = overlap[hit] / (len(grams) + sizes[hit] - overlap[hit])
        scores[scores < SYMBOL_THRESHOLD] = 0
        return scores

    def eligible(self, scope_keys: set[str], kinds: set[str] | None) -> np.ndarray:
        codes = [self.scopes[k] for k in scope_keys if k in self.scopes]
        mask = np.isin(np.frombuffer(self.scope_codes, dtype=np.int32), codes)
        mask &= np.frombuffer(self.alive, dtype=np.int8).astype(bool)
        if kinds:
            wanted = [KIND_CODES[k] for k in kinds if k in KIND_CODES]
            mask &= np.isin(np.frombuffer(self.kinds, dtype=np.int8), wanted)
        return mask


def _pg_trgm_available() -> bool:
    global _PG_TRGM
    if connection.vendor != "postgresql":
        return False
    if _PG_TRGM is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")
            _PG_TRGM = cursor.fetchone() is not None
    return _PG_TRGM


_PG_TRGM: bool | None = None


def _symbol_scores(index: KnowledgeIndex, query: str) -> np.ndarray:
    """Symbol similarity per chunk: by pg_trgm's GIN index when PostgreSQL has it, else in this process."""
    words = symbol_words(query)
    if not words or not looks_like_a_name(query):
        return np.zeros(len(index), dtype=np.float32)
    if not _pg_trgm_available():
        return index.symbol_similarity(query)
    scores = np.zeros(len(index), dtype=np.float32)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, similarity(symbol_words, %s) FROM knowledge_chunk "
            "WHERE tenant_id = %s AND symbol_words %% %s ORDER BY 2 DESC LIMIT %s",
            [words, index.tenant_id, words, FUSION_DEPTH],
        )
        for pk, similarity in cursor.fetchall():
            position = index.position_of.get(pk)
            if position is not None and similarity >= SYMBOL_THRESHOLD:
                scores[position] = similarity
    return scores


@dataclass(frozen=True)
class KnowledgeHit:
    chunk: Chunk
    document_name: str
    score: float  # fused (RRF)
    lexical: float  # BM25 as a share of the question's ceiling
    similarity: float  # cosine to the question (0: no vector)
    symbol: float  # trigram similarity to the symbol (0: below the threshold or no symbol)

    @property
    def citation(self) -> str:
        """How a prompt cites the chunk: `src/billing/invoice.py:40-72 (render_invoice)` or
        `file "requirements.pdf", page 3`."""
        chunk, name = self.chunk, self.document_name
        if chunk.kind == Document.Kind.CODE and chunk.start_line:
            where = f"{chunk.path or name}:{chunk.start_line}-{chunk.end_line}"
            return f"{where} ({chunk.symbol})" if chunk.symbol else where
        parts = [f'file "{name}"']
        if chunk.path and chunk.path != name:
            parts.append(chunk.path)
        if chunk.page:
            parts.append(f"page {chunk.page}")
        if chunk.sheet:
            parts.append(f"sheet {chunk.sheet!r} {chunk.cell_range}".rstrip())
        if chunk.heading:
            parts.append(f"section {chunk.heading!r}")
        if chunk.start_line and not chunk.page:
            parts.append(f"lines {chunk.start_line}-{chunk.end_line}")
        return ", ".join(parts)

    @property
    def relevance(self) -> float:
        """How well the chunk answers, 0 to 1, on a scale that does not depend on the corpus."""
        return max(self.lexical, self.similarity, self.symbol)


def search(
    index: KnowledgeIndex,
    *,
    query: str,
    query_vector: np.ndarray | Callable[[], np.ndarray | None] | None,
    scope_keys: set[str],
    kinds: set[str] | None = None,
    limit: int = 10,
    engine: VectorStore | None = None,
    degradations: list[dict[str, str]] | None = None,
) -> list[KnowledgeHit]:
    """The best `limit` chunks in the given scopes, best first. Scored under the index's lock, as sync() is:
    another request may be adding chunks meanwhile, and the postings' arrays cannot grow while numpy reads
    them. With an `engine` (an index that keeps no vectors), the engine ranks by similarity, asked before
    the lock is taken; if it cannot answer, the ranking is by words and symbols and `degradations` says so."""
    engine_hits = None
    if engine is not None and len(index):
        engine_hits = _engine_hits(engine, index.tenant_id, query_vector, scope_keys, degradations)
    with index.lock:
        if not len(index):
            return []
        eligible = index.eligible(scope_keys, kinds)
        if engine is None:
            lexical, similarity = both_scores(
                index.postings, index.vectors, query_terms(query), query_vector, len(index)
            )
        else:
            lexical = index.postings.bm25(query_terms(query))
            similarity = _engine_similarity(index, engine_hits or [])
        symbol = _symbol_scores(index, query)
        code = np.frombuffer(index.kinds, dtype=np.int8) == KIND_CODES[Document.Kind.CODE]
        vector_weight = np.where(code, CODE_VECTOR_WEIGHT, VECTOR_WEIGHT)
        rankings = ((LEXICAL_WEIGHT, lexical), (vector_weight, similarity), (SYMBOL_WEIGHT, symbol))
        fused = fuse(rankings, eligible, FUSION_DEPTH)
        best = best_first(fused, limit * 2)  # room for chunks deleted meanwhile
        chunk_ids = [index.chunk_ids[i] for i in best.tolist()]
    rows = _chunks(chunk_ids)
    hits = []
    for i, pk in zip(best.tolist(), chunk_ids, strict=True):
        chunk = rows.get(pk)
        if chunk is None or chunk.document_status != Document.Status.READY:
            continue
        hits.append(
            KnowledgeHit(
                chunk=chunk,
                document_name=chunk.document_name,
                score=round(float(fused[i]), 6),
                lexical=round(float(lexical[i]), 4),
                similarity=round(float(similarity[i]), 4),
                symbol=round(float(symbol[i]), 4),
            )
        )
    return hits[:limit]


# Every context call of a tenant with documents reads its best chunks by key: a fixed statement
# (tenants.statements) per size of the key list, in steps of CHUNK_READ_SLOTS (the places left hold 0, which
# no chunk id is), with the document's name and status beside each chunk.
CHUNK_READ_SLOTS = 16


def _chunks(pks: list[int]) -> dict[int, Any]:
    """{id: chunk} of the chunks of these ids still stored, each with `document_name` and
    `document_status`."""
    slots = max(1, -(-len(pks) // CHUNK_READ_SLOTS)) * CHUNK_READ_SLOTS
    return {chunk.pk: chunk for chunk in _chunk_read(slots).run(**list_values("pk", pks, slots, 0))}


@functools.cache
def _chunk_read(slots: int) -> FixedQuery:
    return FixedQuery(
        lambda **pks: (
            Chunk.objects.filter(pk__in=list(pks.values()))
            .defer("embedding")
            .annotate(document_name=F("document__name"), document_status=F("document__status"))
        ),
        **list_samples("pk", slots, 7_123_456_789_200),
    )


def _engine_hits(
    engine: VectorStore,
    tenant_id: Any,
    query_vector: np.ndarray | Callable[[], np.ndarray | None] | None,
    scope_keys: set[str],
    degradations: list[dict[str, str]] | None,
) -> list[VectorHit]:
    """The engine's best FUSION_DEPTH chunks of the tenant in these scopes (none without a query vector, or
    when the engine cannot answer: then a degradation)."""
    vector = query_vector() if callable(query_vector) else query_vector
    if vector is None:
        return []
    scope = VectorScope("chunk", str(tenant_id))
    try:
        return engine.search(scope, vector, FUSION_DEPTH, VectorFilters(scopes=tuple(sorted(scope_keys))))
    except VectorStoreUnavailable:
        if degradations is not None:
            degradations.append(engine_unavailable())
        return []


def _engine_similarity(index: KnowledgeIndex, hits: list[VectorHit]) -> np.ndarray:
    """The engine's scores on the index's positions (0: not among its hits, or not loaded here yet)."""
    similarity = np.zeros(len(index), dtype=np.float32)
    for hit in hits:
        position = index.position_of.get(int(hit.id))
        if position is not None:
            similarity[position] = hit.score
    return similarity


# --- the per-process cache --------------------------------------------------------------------------------

_indexes: "OrderedDict[str, KnowledgeIndex]" = OrderedDict()
_indexes_lock = threading.Lock()
# A rebuilt index drops the postings of deleted documents; rebuild once they are this share of it.
DEAD_SHARE_REBUILD = 0.5


def knowledge_index(tenant_id: Any, *, keeps_vectors: bool = True) -> KnowledgeIndex:
    """The tenant's index, up to date with the database; `keeps_vectors` False when an engine ranks by
    similarity (an index kept the other way is made again)."""
    key = str(tenant_id)
    with _indexes_lock:
        index = _indexes.get(key)
        if (
            index is None
            or index.keeps_vectors != keeps_vectors
            or (len(index) and index.alive.count(0) > DEAD_SHARE_REBUILD * len(index))
        ):
            index = _indexes[key] = KnowledgeIndex(tenant_id, keeps_vectors=keeps_vectors)
        _indexes.move_to_end(key)
        while len(_indexes) > getattr(settings, "MNEMO_KNOWLEDGE_INDEX_TENANTS", 32):
            _indexes.popitem(last=False)
    with index.lock:
        index.sync()
    return index


def knowledge_index_drop(tenant_id: Any) -> None:
    with _indexes_lock:
        _indexes.pop(str(tenant_id), None)


# --- what the API and the context pipeline call -----------------------------------------------------------


@dataclass(frozen=True)
class KnowledgeResult:
    hits: list[KnowledgeHit]
    degradations: list[dict[str, str]]


def knowledge_search(
    *,
    tenant_id: Any,
    query: str,
    end_user_id: Any = None,
    conversation: Any = None,
    kinds: set[str] | None = None,
    limit: int = 10,
) -> KnowledgeResult:
    """Chunks in scope for a question: the tenant-wide documents, with an end user also theirs, with a
    conversation also its own and its end user's."""
    if conversation is not None:
        end_user_id = end_user_id or conversation.end_user_id
    keys = {scope_key()}
    if end_user_id is not None:
        keys.add(scope_key(end_user_id=end_user_id))
    if conversation is not None:
        keys.add(scope_key(conversation=conversation))
    engine = vector_engine()
    index = knowledge_index(tenant_id, keeps_vectors=engine is None)
    degradations: list[dict[str, str]] = []

    def query_vector() -> np.ndarray | None:
        # Asked for after the BM25 pass (retrieval.ranking.both_scores), and only when there are chunks.
        vector, reason = embed_query(query)
        if vector is None:
            degradations.append(
                {"code": "embeddings_unavailable", "message": f"Lexical search only: {reason}"}
            )
        return vector

    hits = search(
        index,
        query=query,
        query_vector=query_vector,
        scope_keys=keys,
        kinds=kinds,
        limit=limit,
        engine=engine,
        degradations=degradations,
    )
    return KnowledgeResult(hits, degradations)
