"""Output shapes of documents, chunks and search hits."""

from typing import Any

from rest_framework import serializers

from knowledge.models import Chunk, Document
from knowledge.search import KnowledgeHit


class DocumentOutputSerializer(serializers.ModelSerializer):
    end_user = serializers.SerializerMethodField()
    conversation = serializers.UUIDField(source="conversation_id", read_only=True, allow_null=True)
    error = serializers.SerializerMethodField()

    class Meta:
        model = Document
        fields = [
            "id", "name", "kind", "format", "status", "error", "scope", "end_user", "conversation", "size",
            "sha256", "chunk_count", "token_count", "details", "created_at", "processed_at",
        ]  # fmt: skip
        read_only_fields = fields

    def get_end_user(self, document: Document) -> str | None:
        return document.end_user.external_id if document.end_user_id else None

    def get_error(self, document: Document) -> dict[str, str] | None:
        if document.status != Document.Status.FAILED:
            return None
        return {"code": document.error_code, "message": document.error}


PROVENANCE = [
    "path", "language", "symbol", "start_line", "end_line", "page", "heading", "sheet", "cell_range",
]  # fmt: skip


class ChunkOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = Chunk
        fields = ["ordinal", *PROVENANCE, "token_count", "content"]
        read_only_fields = fields


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
