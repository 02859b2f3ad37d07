"""Recall beyond the window: the conversation's own messages before the last compaction boundary, ranked by
BM25 against the (rewritten) query, returned with their seq."""

from dataclasses import dataclass

from django.db.models import Q

from conversations.models import Conversation, Message
from memory.lexical import bm25_rank, rrf, tokens

# Recall searches the newest RECALL_SCAN_WINDOW seqs before the boundary (older history lives on in the
# summaries) and ranks at most RECALL_SCAN_LIMIT candidates, so its cost on the request path stays flat
# however long the conversation grows (bench/context_latency.py).
RECALL_SCAN_WINDOW = 2_000
RECALL_SCAN_LIMIT = 200
PREFILTER_TERMS = 8
# A BM25 score below this is a match on common words only ("what next?"): not worth prompt tokens.
RECALL_MIN_SCORE = 2.0


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
    if before_seq <= 0 or not query.strip():
        return []
    base = Message.objects.filter(
        conversation=conversation,
        seq__gt=max(0, before_seq - RECALL_SCAN_WINDOW),
        seq__lte=before_seq,
        kind=Message.Kind.MESSAGE,
        role__in=[Message.Role.USER, Message.Role.ASSISTANT],
    ).exclude(content="")
    terms = sorted({t for t in tokens(query) if len(t) > 1}, key=len, reverse=True)[:PREFILTER_TERMS]
    if not terms:
        return []
    # The database narrows the scan to messages holding a query term; BM25 then ranks those, with the IDF of
    # all messages before the boundary.
    matching = Q()
    for term in terms:
        matching |= Q(content__icontains=term)
    rows = list(
        base.filter(matching).order_by("-seq").values_list("id", "seq", "role", "content")[:RECALL_SCAN_LIMIT]
    )
    if not rows:
        return []
    # The window's size stands in for the corpus size in the IDF: a count would cost a scan per call.
    scored = bm25_rank(query, [r[3] for r in rows], corpus_size=min(before_seq, RECALL_SCAN_WINDOW))
    ranked = [i for i, score in scored if score >= min_score][:limit]
    scores = rrf(ranked)
    return [
        RecallHit(str(rows[i][0]), rows[i][1], rows[i][2], rows[i][3], round(scores[i], 6)) for i in ranked
    ]
