"""Output shapes of the search endpoints' hits (the archival hit's shape is memory's: memory.serializers)."""

from typing import Any

from knowledge.serializers import PROVENANCE
from retrieval.knowledge import KnowledgeHit


def hit_data(hit: KnowledgeHit) -> dict[str, Any]:
    chunk = hit.chunk
    data: dict[str, Any] = {
        "document": str(chunk.document_id),
        "document_name": hit.document_name,
        "kind": chunk.kind,
        "ordinal": chunk.ordinal,
    }
    data.update({name: getattr(chunk, name) for name in PROVENANCE})
    data.update(
        {
            "citation": hit.citation,
            "content": chunk.content,
            "token_count": chunk.token_count,
            "score": hit.score,
            "relevance": round(hit.relevance, 4),
            "lexical": hit.lexical,
            "similarity": hit.similarity,
            "symbol_similarity": hit.symbol,
        }
    )
    return data
