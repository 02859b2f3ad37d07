"""Recall beyond the window: the conversation's own messages before the last compaction boundary, ranked by
BM25 against the (rewritten) query, returned with their seq."""

from dataclasses import dataclass

from conversations.models import Conversation, Message
from memory.lexical import bm25_rank, rrf

# The newest messages before the boundary that are searched (the older ones live on in the summaries).
RECALL_SCAN_LIMIT = 5_000
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
    rows = list(
        Message.objects.filter(
            conversation=conversation,
            seq__lte=before_seq,
            kind=Message.Kind.MESSAGE,
            role__in=[Message.Role.USER, Message.Role.ASSISTANT],
        )
        .exclude(content="")
        .order_by("-seq")
        .values_list("id", "seq", "role", "content")[:RECALL_SCAN_LIMIT]
    )
    ranked = [i for i, score in bm25_rank(query, [r[3] for r in rows]) if score >= min_score][:limit]
    scores = rrf(ranked)
    return [
        RecallHit(str(rows[i][0]), rows[i][1], rows[i][2], rows[i][3], round(scores[i], 6)) for i in ranked
    ]
