"""Recall beyond the window: the conversation's own messages up to the last compaction boundary, found and
ranked by the database's full-text index (memory.lexical), re-ranked by BM25, returned with their seq."""

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Q

from conversations.models import Conversation, Message
from memory.lexical import (
    MESSAGES,
    backend,
    bm25_rank,
    fts5_query,
    rrf,
    scope_token,
    search_phrases,
    selective,
    token_shares,
    tokens,
    tsquery,
)

# Only the query's rarer words select messages (memory.lexical.selective: about RECALL_MATCH_BUDGET matches
# expected; when even the rarest is common, only as many of the newest seqs as should hold that many
# matches), the database ranks the newest RECALL_CANDIDATES of those matches (ts_rank_cd / bm25()), and BM25
# re-ranks its best RECALL_RERANK: the cost of a call stays flat however long the conversation grows
# (bench/context_latency.py), and a rare word is found however far back it was said.
RECALL_MATCH_BUDGET = 150
RECALL_CANDIDATES = 150
RECALL_RERANK = 40
# A BM25 score below this is a match on common words only ("what next?"): not worth prompt tokens.
RECALL_MIN_SCORE = 2.0
# Without a full-text backend (another database): BM25 over rows that hold a query word, newest first.
FALLBACK_SCAN_WINDOW = 2_000
FALLBACK_TERMS = 8


@dataclass
class RecallHit:
    id: str
    seq: int
    role: str
    content: str
    score: float


def recall_messages(
    *,
    conversation: Conversation,
    query: str,
    before_seq: int,
    limit: int = 3,
    min_score: float = RECALL_MIN_SCORE,
) -> list[RecallHit]:
    """The best `limit` user and assistant messages of the conversation with seq <= before_seq for the
    query, best first; none whose BM25 score is below min_score."""
    if before_seq <= 0 or not query.strip():
        return []
    kind = backend()
    if kind is None:
        rows = _candidates_scan(conversation, query, before_seq)
        shares: dict[str, float] = {}
    else:
        phrases = search_phrases(query)
        if not phrases:
            return []
        chosen, atom_shares, density = selective(
            MESSAGES, phrases, scope_size=before_seq, budget=RECALL_MATCH_BUDGET
        )
        after_seq = 0
        if density * before_seq > RECALL_MATCH_BUDGET:
            after_seq = before_seq - int(RECALL_MATCH_BUDGET / density)
        search = _candidates_postgresql if kind == "postgresql" else _candidates_sqlite
        rows = search(conversation, chosen, after_seq, before_seq)
        shares = token_shares(query, atom_shares)
    if not rows:
        return []
    # The messages before the boundary stand in for the corpus in the IDF: a count would cost a scan.
    scored = bm25_rank(query, [r[3] for r in rows], corpus_size=before_seq, shares=shares)
    ranked = [i for i, score in scored if score >= min_score][:limit]
    scores = rrf(ranked)
    return [
        RecallHit(str(rows[i][0]), rows[i][1], rows[i][2], rows[i][3], round(scores[i], 6)) for i in ranked
    ]


def _candidates_postgresql(
    conversation: Conversation, phrases: list[tuple[str, ...]], after_seq: int, before_seq: int
) -> list[tuple[Any, ...]]:
    # The conversation is a lexeme of its messages' vectors, so the GIN index alone finds "this conversation
    # AND any of these words". Only a window of recent seqs names the conversation's column, so that the
    # planner may AND in that range of the scope index; naming it always would let the planner filter every
    # message of a short conversation instead (a few microseconds per row for @@, and it guesses few
    # matches). "seq + 0" keeps it from reading the scope index backwards for the ORDER BY ... LIMIT.
    # The join checks the scope on the message itself.
    window = "AND s.conversation_id = %(conversation)s AND s.seq > %(after)s" if after_seq > 0 else ""
    sql = f"""
        SELECT m.id, m.seq, m.role, m.content FROM (
            SELECT hits.message_id, hits.seq, ts_rank_cd(hits.document, %(terms)s::tsquery) AS rank
            FROM (
                SELECT s.message_id, s.seq, s.document FROM memory_message_search AS s
                WHERE s.document @@ %(q)s::tsquery AND s.seq <= %(before)s {window}
                ORDER BY s.seq + 0 DESC LIMIT %(candidates)s
            ) AS hits
            ORDER BY rank DESC, hits.seq DESC LIMIT %(rerank)s
        ) AS best JOIN conversations_message AS m ON m.id = best.message_id
        WHERE m.conversation_id = %(conversation)s
        ORDER BY best.rank DESC, best.seq DESC
    """  # noqa: S608 - two constant fragments
    params = {
        "conversation": conversation.id,
        "after": after_seq,
        "before": before_seq,
        "q": tsquery(phrases, [scope_token("c", conversation.id)]),
        "terms": tsquery(phrases),
        "candidates": RECALL_CANDIDATES,
        "rerank": RECALL_RERANK,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _candidates_sqlite(
    conversation: Conversation, phrases: list[tuple[str, ...]], after_seq: int, before_seq: int
) -> list[tuple[Any, ...]]:
    # The scope token narrows the match inside FTS5; the join checks the scope on the message itself. FTS5
    # returns the matches newest (highest rowid) first.
    sql = """
        SELECT m.id, m.seq, m.role, m.content FROM (
            SELECT f.rowid AS rid, bm25(memory_message_fts, 0.0, 1.0) AS rank
            FROM memory_message_fts AS f JOIN conversations_message AS c ON c.rowid = f.rowid
            WHERE memory_message_fts MATCH %s AND c.conversation_id = %s AND c.seq > %s AND c.seq <= %s
            ORDER BY f.rowid DESC LIMIT %s
        ) AS hits JOIN conversations_message AS m ON m.rowid = hits.rid
        ORDER BY hits.rank, m.seq DESC LIMIT %s
    """
    match = fts5_query([scope_token("c", conversation.id)], phrases)
    params = [match, conversation.id.hex, after_seq, before_seq, RECALL_CANDIDATES, RECALL_RERANK]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    # SQLite stores the uuid as hex; the id is returned as Django would.
    return [(uuid.UUID(r[0]), *r[1:]) for r in rows]


def _candidates_scan(conversation: Conversation, query: str, before_seq: int) -> list[tuple[Any, ...]]:
    """No full-text backend: the newest messages holding a query word, from a bounded seq window."""
    terms = sorted({t for t in tokens(query) if len(t) > 1}, key=len, reverse=True)[:FALLBACK_TERMS]
    if not terms:
        return []
    matching = Q()
    for term in terms:
        matching |= Q(content__icontains=term)
    return list(
        Message.objects.filter(
            conversation=conversation,
            seq__gt=max(0, before_seq - FALLBACK_SCAN_WINDOW),
            seq__lte=before_seq,
            kind=Message.Kind.MESSAGE,
            role__in=[Message.Role.USER, Message.Role.ASSISTANT],
        )
        .exclude(content="")
        .filter(matching)
        .order_by("-seq")
        .values_list("id", "seq", "role", "content")[:RECALL_CANDIDATES]
    )
