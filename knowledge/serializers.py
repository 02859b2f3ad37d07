"""Output shapes of documents and chunks (a search hit's: retrieval.serializers)."""

from rest_framework import serializers

from knowledge.models import Chunk, Document


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
        return document.end_user.external_id if document.end_user else None

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
