"""Recall across an end user's conversations: the messages of the user's other conversations in the tenant,
found and ranked by the database's full-text index (retrieval.lexical), re-ranked by BM25, returned with their
seq and the excerpt that matched. The asking conversation's own history is retrieved by
retrieval.history (whole history, lexical and vector), not here."""

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Q

from conversations.models import Conversation, Message
from providers.text import search_words, sentence_spans
from retrieval.lexical import (
    MESSAGES,
    backend,
    bm25_rank,
    fts5_query,
    scope_token,
    search_phrases,
    selective,
    token_shares,
    tsquery,
)
from retrieval.ranking import rrf
from tenants.statements import FixedQuery, Read

# Only the query's rarer words select messages (retrieval.lexical.selective: about RECALL_MATCH_BUDGET matches
# expected); the database ranks their matches (ts_rank_cd / bm25()) and BM25 re-ranks its best RECALL_RERANK,
# so a rare word is found however far back it was said.
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
# Without a full-text backend (another database): BM25 over the newest rows that hold a query word.
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
    name: str = ""  # the speaker's name, when the client gave one
    day: str = ""  # the date it was said (YYYY-MM-DD)


def recall_other_conversations(
    *,
    conversation: Conversation,
    query: str,
    limit: int = 3,
    min_score: float = RECALL_MIN_SCORE,
    expansion: str = "",
) -> list[RecallHit]:
    """The best `limit` user and assistant messages for the query in the end user's other conversations of
    the tenant (all their messages), best first, none whose BM25 score is below min_score. `expansion`:
    words a query rewrite added; they find messages too but weigh less (lexical.EXPANSION_WEIGHT)."""
    if not query.strip() or conversation.end_user_id is None:
        return []
    others = _other_conversations(conversation)
    scope = sum(last_seq for _, last_seq in others.values())
    if scope <= 0:
        return []
    rows, shares = _matching_rows(list(others), query, expansion, scope)
    if not rows:
        return []
    # The messages searched stand in for the corpus in the IDF: a count would cost a scan.
    scored = bm25_rank(query, [r[3] for r in rows], corpus_size=scope, shares=shares, expansion=expansion)
    pool = [(i, score) for i, score in scored if score >= min_score][:RECALL_PASSAGE_POOL]
    best_sentence = _best_sentences(rows, pool, query, scope, shares, expansion)
    order = sorted(pool, key=lambda item: (-best_sentence.get(item[0], (0.0,))[0], -item[1]))
    ranked = [i for i, _ in order][:limit]
    scores = rrf(ranked)
    hits = []
    for i in ranked:
        pk, seq, role, content, conversation_id, name, created_at = rows[i]
        hits.append(
            RecallHit(
                str(pk),
                seq,
                role,
                content,
                round(scores[i], 6),
                conversation_id=str(conversation_id),
                conversation_title=others[conversation_id][0],
                excerpt=excerpt(content, best_sentence.get(i, (0.0, None))[1]),
                name=name,
                day=_day(created_at),
            )
        )
    return hits


# What a candidate row holds, in every backend's order.
_ROW_COLUMNS = ("id", "seq", "role", "content", "conversation_id", "name", "created_at")


def _day(created_at: datetime | str) -> str:
    """The date of a row's created_at: a datetime from the ORM and PostgreSQL, the stored text from SQLite's
    raw rows (its date is its first ten characters, in UTC as stored)."""
    return created_at.date().isoformat() if isinstance(created_at, datetime) else str(created_at)[:10]


# Read by every context call of an end user's conversation: compiled once (tenants.statements).
_OTHERS = FixedQuery(
    lambda tenant_id, end_user_id, conversation_id: (
        Conversation.objects.filter(tenant_id=tenant_id, end_user_id=end_user_id)
        .exclude(pk=conversation_id)
        .order_by("-created_at")
        .values_list("id", "title", "last_seq")[:RECALL_OTHER_CONVERSATIONS]
    ),
    tenant_id=uuid.UUID(int=0x07E1),
    end_user_id=-7_000_003,
    conversation_id=uuid.UUID(int=0x07E2),
)


def other_conversations_reads(conversation: Conversation) -> list[Read]:
    """The list of the end user's other conversations, for reading it ahead (tenants.statements)."""
    c = conversation
    if c.end_user_id is None:
        return []
    return [(_OTHERS, {"tenant_id": c.tenant_id, "end_user_id": c.end_user_id, "conversation_id": c.pk})]


def _other_conversations(conversation: Conversation) -> dict[Any, tuple[str, int]]:
    """The end user's other conversations in the tenant, newest first: id -> (title, last seq)."""
    [(query, values)] = other_conversations_reads(conversation)
    rows = query.run(**values)
    return {pk: (title, last_seq) for pk, title, last_seq in rows}


def _matching_rows(
    conversations: list[Any], query: str, expansion: str, scope: int
) -> tuple[list[tuple[Any, ...]], dict[str, float]]:
    """(id, seq, role, content, conversation id) of the messages the database ranks best for the query's
    selective phrases, and each query word's share of the documents (for BM25's IDF)."""
    kind = backend()
    if kind is None:
        return _candidates_scan(conversations, f"{query} {expansion}"), {}
    own = search_phrases(query)
    added = frozenset(p for p in search_phrases(expansion) if p not in own)
    phrases = own + sorted(added)
    if not phrases:
        return [], {}
    chosen, atom_shares, density = selective(
        MESSAGES, phrases, scope_size=scope, budget=RECALL_MATCH_BUDGET, secondary=added
    )
    shares = token_shares(f"{query} {expansion}".strip(), atom_shares)
    # When even the rarest word would bring many more matches than the budget, it is too common to find
    # anything specific there: nothing is searched.
    if density * scope > 2 * RECALL_MATCH_BUDGET:
        return [], shares
    search = _others_postgresql if kind == "postgresql" else _others_sqlite
    return search(conversations, chosen), shares


def _best_sentences(
    rows: list[tuple[Any, ...]],
    pool: list[tuple[int, float]],
    query: str,
    corpus: int,
    shares: dict[str, float],
    expansion: str,
) -> dict[int, tuple[float, tuple[int, int]]]:
    """A fact is a sentence in a long message: each pooled message's best sentence by BM25 (row index ->
    (score, span)), which ranks it again and is the excerpt its hit carries."""
    sentences = [(i, span) for i, _ in pool for span in sentence_spans(rows[i][3])]
    texts = [rows[i][3][a:b] for i, (a, b) in sentences]
    best: dict[int, tuple[float, tuple[int, int]]] = {}
    for index, score in bm25_rank(query, texts, corpus_size=corpus, shares=shares, expansion=expansion):
        i, span = sentences[index]
        if i not in best:
            best[i] = (score, span)
    return best


def excerpt(content: str, sentence: tuple[int, int] | None, *, chars: int = RECALL_EXCERPT_CHARS) -> str:
    """The sentence at `sentence` with its neighbours, in about `chars` characters (… marks a cut); the whole
    content when it is that short."""
    if len(content) <= chars:
        return content
    spans = sentence_spans(content)
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


def _others_postgresql(conversations: list[Any], phrases: list[tuple[str, ...]]) -> list[tuple[Any, ...]]:
    """The best matches in the user's other conversations, all their messages: ranked by the database over
    all matches of the chosen (rare enough) phrases."""
    sql = """
        SELECT m.id, m.seq, m.role, m.content, m.conversation_id, m.name, m.created_at FROM (
            SELECT s.message_id, s.seq, ts_rank_cd(s.document, %(terms)s::tsquery) AS rank
            FROM memory_message_search AS s WHERE s.document @@ %(q)s::tsquery
            ORDER BY rank DESC, s.seq DESC LIMIT %(rerank)s
        ) AS best JOIN conversations_message AS m ON m.id = best.message_id
        WHERE m.conversation_id = ANY(%(conversations)s)
        ORDER BY best.rank DESC, best.seq DESC
    """
    params: dict[str, Any] = {
        "conversations": conversations,
        "q": tsquery(phrases, [scope_token("c", pk) for pk in conversations]),
        "terms": tsquery(phrases),
        "rerank": RECALL_RERANK,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows: list[tuple[Any, ...]] = cursor.fetchall()
        return rows


def _others_sqlite(conversations: list[Any], phrases: list[tuple[str, ...]]) -> list[tuple[Any, ...]]:
    placeholders = ", ".join(["%s"] * len(conversations))
    sql = f"""
        SELECT m.id, m.seq, m.role, m.content, m.conversation_id, m.name, m.created_at
        FROM memory_message_fts AS f JOIN conversations_message AS m ON m.rowid = f.rowid
        WHERE memory_message_fts MATCH %s AND m.conversation_id IN ({placeholders})
        ORDER BY bm25(memory_message_fts, 0.0, 1.0), m.seq DESC LIMIT %s
    """  # noqa: S608 - placeholders only
    match = fts5_query([scope_token("c", pk) for pk in conversations], phrases)
    with connection.cursor() as cursor:
        cursor.execute(sql, [match, *[pk.hex for pk in conversations], RECALL_RERANK])
        rows = cursor.fetchall()
    return [(uuid.UUID(r[0]), *r[1:4], uuid.UUID(r[4]), r[5], r[6]) for r in rows]


def _candidates_scan(conversations: list[Any], query: str) -> list[tuple[Any, ...]]:
    """No full-text backend: the newest messages of these conversations holding a query word."""
    terms = sorted({t for t in search_words(query) if len(t) > 1}, key=len, reverse=True)[:FALLBACK_TERMS]
    if not terms:
        return []
    matching = Q()
    for term in terms:
        matching |= Q(content__icontains=term)
    return list(
        Message.objects.filter(
            conversation_id__in=conversations,
            kind=Message.Kind.MESSAGE,
            role__in=[Message.Role.USER, Message.Role.ASSISTANT],
        )
        .exclude(content="")
        .filter(matching)
        .order_by("-created_at")
        .values_list("id", "seq", "role", "content", "conversation_id", "name", "created_at")[
            :RECALL_CANDIDATES
        ]
    )
