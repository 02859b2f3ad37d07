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


def citation(chunk: Chunk, document_name: str) -> str:
    """How a prompt cites the chunk: `src/billing/invoice.py:40-72 (render_invoice)` or
    `file "requirements.pdf", page 3`."""
    if chunk.kind == Document.Kind.CODE and chunk.start_line:
        where = f"{chunk.path or document_name}:{chunk.start_line}-{chunk.end_line}"
        return f"{where} ({chunk.symbol})" if chunk.symbol else where
    parts = [f'file "{document_name}"']
    if chunk.path and chunk.path != document_name:
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
            "citation": citation(chunk, hit.document_name),
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
