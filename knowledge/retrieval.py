"""What the context pipeline's retrieve stage takes from knowledge: the chunks in the conversation's scope
(tenant-wide, its end user's, its own) that answer the question, each as a cited text for B5 with the
source fields the context response lists. The pipeline turns them into its own items (knowledge sits below
prefix_cache and context and does not know their types)."""

from dataclasses import dataclass
from typing import Any

from conversations.models import Conversation
from knowledge.search import knowledge_search

CANDIDATES = 8


@dataclass(frozen=True)
class KnowledgeCandidate:
    text: str  # `[file "requirements.pdf", page 3] …` or `[src/app.py:40-72 (render)] …`
    source: dict[str, Any]
    score: float  # relevance, 0 to 1


def knowledge_candidates(
    *, conversation: Conversation, query: str, min_relevance: float, limit: int = CANDIDATES
) -> list[KnowledgeCandidate]:
    """Chunks for B5, best first; those below `min_relevance` are not worth prompt tokens. Lexical only
    without an embedding model (the retrieve stage reports that once, for every store)."""
    result = knowledge_search(
        tenant_id=conversation.tenant_id, query=query, conversation=conversation, limit=limit
    )
    out = []
    for hit in result.hits:
        if hit.relevance < min_relevance:
            continue
        chunk = hit.chunk
        source = {
            "kind": "knowledge",
            "id": f"chunk:{chunk.pk}",
            "document": str(chunk.document_id),
            "citation": hit.citation,
            "score": round(hit.relevance, 4),
            "rank_score": hit.score,
        }
        out.append(KnowledgeCandidate(f"[{hit.citation}] {chunk.content.strip()}", source, hit.relevance))
    return out
