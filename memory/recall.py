"""Recall beyond the window: the conversation's own messages up to the last compaction boundary and, for an
end user's conversation, the messages of the user's other conversations (same tenant), found and ranked by the
database's full-text index (memory.lexical), re-ranked by BM25, returned with their seq and an excerpt."""

import functools
import re
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
RECALL_RERANK = 60
# The user's other conversations searched, newest first.
RECALL_OTHER_CONVERSATIONS = 50
# A BM25 score below this is a match on common words only ("what next?"): not worth prompt tokens.
RECALL_MIN_SCORE = 2.0
# A hit carries the part of its message that matched, not its head: about this many characters.
RECALL_EXCERPT_CHARS = 200
# The best messages by BM25 that are ranked again by their best sentence.
RECALL_PASSAGE_POOL = 20
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
    conversation_id: str = ""  # set when the message is in another conversation of the end user
    conversation_title: str = ""
    excerpt: str = ""


def recall_messages(
    *,
    conversation: Conversation,
    query: str,
    before_seq: int,
    limit: int = 3,
    min_score: float = RECALL_MIN_SCORE,
    other_conversations: bool = False,
    expansion: str = "",
) -> list[RecallHit]:
    """The best `limit` user and assistant messages for the query, best first, none whose BM25 score is below
    min_score: of this conversation with seq <= before_seq and, with other_conversations, of the end user's
    other conversations in the tenant (all their messages). `expansion`: words a query rewrite added; they
    find messages too but weigh less (memory.lexical.EXPANSION_WEIGHT)."""
    if not query.strip():
        return []
    full = f"{query} {expansion}".strip()
    others: dict[Any, tuple[str, int]] = {}
    if other_conversations and conversation.end_user_id is not None:
        others = {
            pk: (title, last_seq)
            for pk, title, last_seq in Conversation.objects.filter(
                tenant_id=conversation.tenant_id, end_user_id=conversation.end_user_id
            )
            .exclude(pk=conversation.pk)
            .order_by("-created_at")
            .values_list("id", "title", "last_seq")[:RECALL_OTHER_CONVERSATIONS]
        }
    if before_seq <= 0 and not others:
        return []
    kind = backend()
    shares: dict[str, float] = {}
    if kind is None:
        rows = _candidates_scan(conversation, full, before_seq)
    else:
        own = search_phrases(query)
        added = frozenset(p for p in search_phrases(expansion) if p not in own)
        phrases = own + sorted(added)
        if not phrases:
            return []
        rows = []
        if before_seq > 0:
            chosen, atom_shares, density = selective(
                MESSAGES, phrases, scope_size=before_seq, budget=RECALL_MATCH_BUDGET, secondary=added
            )
            after_seq = 0
            if density * before_seq > RECALL_MATCH_BUDGET:
                after_seq = before_seq - int(RECALL_MATCH_BUDGET / density)
            search = _candidates_postgresql if kind == "postgresql" else _candidates_sqlite
            rows += search(conversation, chosen, after_seq, before_seq)
            shares = token_shares(full, atom_shares)
        scope = sum(last_seq for _, last_seq in others.values())
        if scope > 0:
            chosen, atom_shares, density = selective(
                MESSAGES, phrases, scope_size=scope, budget=RECALL_MATCH_BUDGET, secondary=added
            )
            # Ranked over all their matches: when even the rarest word would bring many more than the
            # budget, it is too common to find anything specific there, and they are not searched.
            if density * scope <= 2 * RECALL_MATCH_BUDGET:
                search = _others_postgresql if kind == "postgresql" else _others_sqlite
                rows += search(list(others), chosen)
            shares = token_shares(full, atom_shares)
    if not rows:
        return []
    # The messages searched stand in for the corpus in the IDF: a count would cost a scan.
    corpus = max(0, before_seq) + sum(last_seq for _, last_seq in others.values())
    scored = bm25_rank(query, [r[3] for r in rows], corpus_size=corpus, shares=shares, expansion=expansion)
    pool = [(i, score) for i, score in scored if score >= min_score][:RECALL_PASSAGE_POOL]
    # A fact is a sentence in a long message: the best messages are ranked again by their best sentence,
    # which is also the excerpt the hit carries.
    sentences = [(i, span) for i, _ in pool for span in _sentence_spans(rows[i][3])]
    texts = [rows[i][3][a:b] for i, (a, b) in sentences]
    best_sentence: dict[int, tuple[float, tuple[int, int]]] = {}
    for index, score in bm25_rank(query, texts, corpus_size=corpus, shares=shares, expansion=expansion):
        i, span = sentences[index]
        if i not in best_sentence:
            best_sentence[i] = (score, span)
    order = sorted(pool, key=lambda item: (-best_sentence.get(item[0], (0.0,))[0], -item[1]))
    ranked = [i for i, _ in order][:limit]
    scores = rrf(ranked)
    hits = []
    for i in ranked:
        pk, seq, role, content, conversation_id = rows[i]
        other = conversation_id != conversation.pk
        span = best_sentence.get(i, (0.0, None))[1]
        hits.append(
            RecallHit(
                str(pk),
                seq,
                role,
                content,
                round(scores[i], 6),
                conversation_id=str(conversation_id) if other else "",
                conversation_title=others.get(conversation_id, ("", 0))[0] if other else "",
                excerpt=excerpt(content, span),
            )
        )
    return hits


@functools.lru_cache(maxsize=4096)
def _sentence_spans(content: str) -> tuple[tuple[int, int], ...]:
    """(start, end) of each sentence (or line) of the content."""
    spans = [(m.start(), m.end()) for m in _SENTENCE.finditer(content) if m.group(0).strip()]
    return tuple(spans) or ((0, len(content)),)


_SENTENCE = re.compile(r"[^\n]+?(?:[.!?。！？](?=\s)|$)|[^\n]+")


def excerpt(content: str, sentence: tuple[int, int] | None, *, chars: int = RECALL_EXCERPT_CHARS) -> str:
    """The sentence at `sentence` with its neighbours, in about `chars` characters (… marks a cut); the whole
    content when it is that short."""
    if len(content) <= chars:
        return content
    spans = _sentence_spans(content)
    best = spans.index(sentence) if sentence in spans else 0
    first = last = best
    # Grow around the sentence, the next one first (a statement's value tends to follow its subject).
    while True:
        grown = False
        for candidate in (last + 1, first - 1):
            if 0 <= candidate < len(spans):
                start = spans[min(first, candidate)][0]
                end = spans[max(last, candidate)][1]
                if end - start <= chars:
                    first, last = min(first, candidate), max(last, candidate)
                    grown = True
        if not grown:
            break
    start, end = spans[first][0], min(spans[last][1], spans[first][0] + chars)
    return ("…" if start > 0 else "") + content[start:end].strip() + ("…" if end < len(content) else "")


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
        SELECT m.id, m.seq, m.role, m.content, m.conversation_id FROM (
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
        SELECT m.id, m.seq, m.role, m.content, m.conversation_id FROM (
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
    # SQLite stores the uuid as hex; ids are returned as Django would.
    return [(uuid.UUID(r[0]), *r[1:4], uuid.UUID(r[4])) for r in rows]


def _others_postgresql(conversations: list[Any], phrases: list[tuple[str, ...]]) -> list[tuple[Any, ...]]:
    """The best matches in the user's other conversations, all their messages: ranked by the database over
    all matches of the chosen (rare enough) phrases."""
    sql = """
        SELECT m.id, m.seq, m.role, m.content, m.conversation_id FROM (
            SELECT s.message_id, s.seq, ts_rank_cd(s.document, %(terms)s::tsquery) AS rank
            FROM memory_message_search AS s WHERE s.document @@ %(q)s::tsquery
            ORDER BY rank DESC, s.seq DESC LIMIT %(rerank)s
        ) AS best JOIN conversations_message AS m ON m.id = best.message_id
        WHERE m.conversation_id = ANY(%(conversations)s)
        ORDER BY best.rank DESC, best.seq DESC
    """
    params = {
        "conversations": conversations,
        "q": tsquery(phrases, [scope_token("c", pk) for pk in conversations]),
        "terms": tsquery(phrases),
        "rerank": RECALL_RERANK,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _others_sqlite(conversations: list[Any], phrases: list[tuple[str, ...]]) -> list[tuple[Any, ...]]:
    placeholders = ", ".join(["%s"] * len(conversations))
    sql = f"""
        SELECT m.id, m.seq, m.role, m.content, m.conversation_id
        FROM memory_message_fts AS f JOIN conversations_message AS m ON m.rowid = f.rowid
        WHERE memory_message_fts MATCH %s AND m.conversation_id IN ({placeholders})
        ORDER BY bm25(memory_message_fts, 0.0, 1.0), m.seq DESC LIMIT %s
    """  # noqa: S608 - placeholders only
    match = fts5_query([scope_token("c", pk) for pk in conversations], phrases)
    with connection.cursor() as cursor:
        cursor.execute(sql, [match, *[pk.hex for pk in conversations], RECALL_RERANK])
        rows = cursor.fetchall()
    return [(uuid.UUID(r[0]), *r[1:4], uuid.UUID(r[4])) for r in rows]


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
        .values_list("id", "seq", "role", "content", "conversation_id")[:RECALL_CANDIDATES]
    )
