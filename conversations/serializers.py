"""Output shapes shared by the REST responses and the WebSocket events (they are truly the same shape:
a client reading a socket event and a client reading the API see one message representation)."""

from datetime import datetime
from typing import Any
from uuid import UUID

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from conversations.embedding import retrieval_index_status
from conversations.models import Conversation, Message, Turn
from conversations.readiness import conversation_readiness
from conversations.selectors import conversation_participants
from tenants.models import EndUser


def _time(value: datetime | None) -> str | None:
    """DRF's DateTimeField output (UTC, 'Z'), written out: this runs on every append."""
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _uuid(value: UUID | None) -> str | None:
    return None if value is None else str(value)


class MessageOutputSerializer(serializers.ModelSerializer):
    conversation_id = serializers.UUIDField(read_only=True)
    turn_id = serializers.UUIDField(read_only=True, allow_null=True)
    parent_id = serializers.UUIDField(read_only=True, allow_null=True)
    name = serializers.CharField(
        read_only=True, allow_null=True, help_text="The speaker (OpenAI's message name); null when none."
    )

    class Meta:
        model = Message
        fields = [
            "id",
            "conversation_id",
            "seq",
            "turn_id",
            "parent_id",
            "role",
            "name",
            "kind",
            "content",
            "parts",
            "token_count",
            "completed",
            "is_error",
            "idempotency_key",
            "metadata",
            "created_at",
        ]
        read_only_fields = fields

    def to_representation(self, m: Message) -> dict[str, Any]:
        # The same fields as declared (they document the schema), built directly: ModelSerializer would
        # rebuild its fields for every message, a third of an append's CPU.
        return {
            "id": str(m.id),
            "conversation_id": str(m.conversation_id),
            "seq": m.seq,
            "turn_id": _uuid(m.turn_id),
            "parent_id": _uuid(m.parent_id),
            "role": m.role,
            "name": m.name or None,
            "kind": m.kind,
            "content": m.content,
            "parts": m.parts,
            "token_count": m.token_count,
            "completed": m.completed,
            "is_error": m.is_error,
            "idempotency_key": m.idempotency_key,
            "metadata": m.metadata,
            "created_at": _time(m.created_at),
        }


class TurnOutputSerializer(serializers.ModelSerializer):
    conversation_id = serializers.UUIDField(read_only=True)

    class Meta:
        model = Turn
        fields = ["id", "conversation_id", "index", "status", "started_at", "ended_at"]
        read_only_fields = fields

    def to_representation(self, t: Turn) -> dict[str, Any]:
        return {
            "id": str(t.id),
            "conversation_id": str(t.conversation_id),
            "index": t.index,
            "status": t.status,
            "started_at": _time(t.started_at),
            "ended_at": _time(t.ended_at),
        }


class ConversationOutputSerializer(serializers.ModelSerializer):
    end_user: "serializers.SlugRelatedField[EndUser]" = serializers.SlugRelatedField(
        slug_field="external_id", read_only=True, allow_null=True
    )
    archived = serializers.SerializerMethodField()
    message_count = serializers.IntegerField(source="last_seq", read_only=True)

    class Meta:
        model = Conversation
        fields = [
            "id",
            "end_user",
            "model",
            "title",
            "metadata",
            "message_count",
            "archived",
            "archived_at",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_archived(self, obj: Conversation) -> bool:
        return obj.archived_at is not None


class RetrievalIndexSerializer(serializers.Serializer):
    messages = serializers.IntegerField(help_text="Messages retrieval can find by their words.")
    embedded = serializers.IntegerField(help_text="Of those, how many have vectors of the current model.")
    model = serializers.CharField(allow_null=True, help_text="The embedding model; null: lexical only.")


class ParticipantSerializer(serializers.Serializer):
    name = serializers.CharField(
        allow_null=True, help_text="The speaker's name; null for the role's messages without one."
    )
    role = serializers.CharField(help_text="system, user, assistant or tool.")
    messages = serializers.IntegerField(help_text="How many messages (kind message) this speaker wrote.")


class ReadinessSerializer(serializers.Serializer):
    ready = serializers.BooleanField(
        help_text="Everything that changes what a context call returns is done: wait on this after an import."
    )
    waiting_for = serializers.ListField(
        child=serializers.CharField(),
        help_text="The background work still under way: vectors, memory_agent, compaction.",
    )


class ConversationDetailOutputSerializer(ConversationOutputSerializer):
    """One conversation, with its readiness (a client that imported history waits until `readiness.ready`:
    vectors, the memory agent's reading and due compactions run in the background), the state of its
    retrieval index and who took part."""

    readiness = serializers.SerializerMethodField()
    retrieval_index = serializers.SerializerMethodField()
    participants = serializers.SerializerMethodField()

    class Meta(ConversationOutputSerializer.Meta):
        fields = [*ConversationOutputSerializer.Meta.fields, "readiness", "retrieval_index", "participants"]
        read_only_fields = fields

    @extend_schema_field(ReadinessSerializer)
    def get_readiness(self, obj: Conversation) -> dict[str, Any]:
        return conversation_readiness(obj)

    @extend_schema_field(RetrievalIndexSerializer)
    def get_retrieval_index(self, obj: Conversation) -> dict[str, Any]:
        return retrieval_index_status(obj)

    @extend_schema_field(ParticipantSerializer(many=True))
    def get_participants(self, obj: Conversation) -> list[dict[str, Any]]:
        return conversation_participants(conversation=obj)


class MessageBatchOutputSerializer(serializers.Serializer):
    messages = MessageOutputSerializer(many=True)
