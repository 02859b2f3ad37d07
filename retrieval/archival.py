"""The search over an end user's archival memories: the lexical ranking (the database's full-text index,
re-ranked by BM25) and the vector ranking (exact, numpy over the stored vectors; or the vector engine's when
MNEMO_VECTOR_STORE names one) fused with RRF."""

import uuid
from typing import Any

import numpy as np
from django.db import connection

from memory.archival import SEARCH_SCAN_LIMIT, SearchHit, SearchOutcome, live_memories
from providers.embeddings import embed_query, from_bytes
from retrieval.lexical import (
    MEMORIES,
    atom_shares,
    backend,
    bm25_rank,
    fts5_query,
    scope_token,
    search_phrases,
    token_shares,
    tsquery,
)
from retrieval.ranking import rrf
from retrieval.vectors.current import vector_engine
from retrieval.vectors.degraded import engine_unavailable
from retrieval.vectors.store import VectorFilters, VectorScope, VectorStore, VectorStoreUnavailable
from tenants.models import EndUser


def archival_search(
    *, end_user: EndUser, query: str, limit: int = 10, candidates: int = 50, expansion: str = ""
) -> SearchOutcome:
    """Hybrid search over the user's live memories: the lexical ranking (the database's full-text index,
    re-ranked by BM25) and the cosine ranking (exact over the stored vectors, or the vector engine's) fused
    with RRF; an engine that cannot answer leaves the lexical ranking alone, said in the degradations.
    `expansion`: words a query rewrite added, weighing less in the lexical ranking; the vector ranking embeds
    the query alone."""
    if not query.strip():
        return SearchOutcome([], "lexical")
    lexical = _lexical_ranking(end_user, query, candidates, expansion)
    degradations: list[dict[str, str]] = []
    vector_ranking: list[Any] = []
    similarity: dict[Any, float] = {}
    vector, model = embed_query(query)
    if vector is None:
        degradations.append({"code": "embeddings_unavailable", "message": f"Lexical search only: {model}"})
    else:
        engine = vector_engine()
        if engine is None:
            vector_ranking, similarity = _exact_ranking(end_user, vector, model, candidates)
        else:
            try:
                vector_ranking, similarity = _engine_ranking(engine, end_user, vector, candidates)
            except VectorStoreUnavailable:
                degradations.append(engine_unavailable())
                vector = None
    mode = "hybrid" if vector is not None else "lexical"
    if not lexical and not vector_ranking:
        return SearchOutcome([], mode, degradations)
    fused = rrf(lexical, vector_ranking)
    lexical_pos = {key: r for r, key in enumerate(lexical, start=1)}
    vector_pos = {key: r for r, key in enumerate(vector_ranking, start=1)}
    # Ties (same fused score) go to the lexical order, then the vector order.
    tie = {key: (lexical_pos.get(key, len(lexical) + 1), vector_pos.get(key, 0)) for key in fused}
    best = sorted(fused, key=lambda key: (-fused[key], tie[key]))[:limit]
    memories = live_memories(end_user).in_bulk(best)
    hits = [
        SearchHit(
            memories[key],
            round(fused[key], 6),
            lexical_pos.get(key),
            vector_pos.get(key),
            round(similarity.get(key, 0.0), 4),
        )
        for key in best
        if key in memories
    ]
    return SearchOutcome(hits, mode, degradations)


def _exact_ranking(
    end_user: EndUser, vector: np.ndarray, model: str, candidates: int
) -> tuple[list[Any], dict[Any, float]]:
    """The user's live memories embedded by `model`, best `candidates` first by cosine, and every one's
    cosine: numpy over the stored vectors (the newest SEARCH_SCAN_LIMIT)."""
    stored = (
        live_memories(end_user)
        .filter(embedding__isnull=False, embedding_model=model)
        .order_by("-created_at")
        .values_list("id", "embedding")[:SEARCH_SCAN_LIMIT]
    )
    rows = [(pk, embedding) for pk, embedding in stored if embedding is not None]
    if not rows:
        return [], {}
    matrix = np.stack([from_bytes(embedding) for _, embedding in rows])
    sims = matrix @ vector
    order = np.argsort(-sims, kind="stable")[:candidates]
    return [rows[j][0] for j in order], dict(zip((row[0] for row in rows), sims.tolist(), strict=True))


def _engine_ranking(
    engine: VectorStore, end_user: EndUser, vector: np.ndarray, candidates: int
) -> tuple[list[Any], dict[Any, float]]:
    """The engine's best `candidates` memories of the user, and their cosines (an invalidated memory left
    in the engine by a failed delete is dropped when the hits are read: only live ones are)."""
    scope = VectorScope("memory", str(end_user.tenant_id))
    hits = engine.search(scope, vector, candidates, VectorFilters(scopes=(str(end_user.pk),)))
    ranking = [uuid.UUID(hit.id) for hit in hits]
    return ranking, {key: hit.score for key, hit in zip(ranking, hits, strict=True)}


# The database ranks the user's matching memories and BM25 re-ranks its best LEXICAL_CANDIDATES.
LEXICAL_CANDIDATES = 100


def _lexical_ranking(end_user: EndUser, query: str, candidates: int, expansion: str = "") -> list[Any]:
    """Ids of the user's live memories that share a word with the query, best first."""
    full = f"{query} {expansion}".strip()
    kind = backend()
    shares: dict[str, float] = {}
    if kind is None:
        rows = list(
            live_memories(end_user).order_by("-created_at").values_list("id", "content")[:SEARCH_SCAN_LIMIT]
        )
    else:
        phrases = search_phrases(full)
        if not phrases:
            return []
        # Memories are short and few per user: every phrase selects, common or not.
        shares_of_atoms, _ = atom_shares(MEMORIES, (a for p in phrases for a in p))
        search = _memories_postgresql if kind == "postgresql" else _memories_sqlite
        rows = search(end_user, phrases)
        shares = token_shares(full, shares_of_atoms)
    if not rows:
        return []
    corpus = len(rows) if kind is None else live_memories(end_user).count()
    scored = bm25_rank(query, [r[1] for r in rows], corpus_size=corpus, shares=shares, expansion=expansion)
    return [rows[i][0] for i, _ in scored[:candidates]]


def _memories_postgresql(end_user: EndUser, phrases: list[tuple[str, ...]]) -> list[tuple[Any, str]]:
    sql = """
        SELECT a.id, a.content FROM memory_archival_search AS s
        JOIN memory_archivalmemory AS a ON a.id = s.memory_id
        WHERE s.document @@ %(q)s::tsquery AND s.end_user_id = %(user)s
          AND a.end_user_id = %(user)s AND a.tenant_id = %(tenant)s AND a.invalidated_at IS NULL
        ORDER BY ts_rank_cd(s.document, %(terms)s::tsquery) DESC, a.created_at DESC
        LIMIT %(limit)s
    """
    params: dict[str, Any] = {
        "user": end_user.pk,
        "tenant": end_user.tenant_id,
        "q": tsquery(phrases, [scope_token("u", end_user.pk)]),
        "terms": tsquery(phrases),
        "limit": LEXICAL_CANDIDATES,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows: list[tuple[Any, str]] = cursor.fetchall()
        return rows


def _memories_sqlite(end_user: EndUser, phrases: list[tuple[str, ...]]) -> list[tuple[Any, str]]:
    sql = """
        SELECT a.id, a.content FROM memory_archival_fts AS f
        JOIN memory_archivalmemory AS a ON a.rowid = f.rowid
        WHERE memory_archival_fts MATCH %s
          AND a.end_user_id = %s AND a.tenant_id = %s AND a.invalidated_at IS NULL
        ORDER BY bm25(memory_archival_fts, 0.0, 1.0), a.created_at DESC
        LIMIT %s
    """
    match = fts5_query([scope_token("u", end_user.pk)], phrases)
    with connection.cursor() as cursor:
        cursor.execute(sql, [match, end_user.pk, end_user.tenant_id.hex, LEXICAL_CANDIDATES])
        return [(uuid.UUID(r[0]), r[1]) for r in cursor.fetchall()]
