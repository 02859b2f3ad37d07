"""Output shapes shared by the REST responses and the WebSocket events (they are truly the same shape:
a client reading a socket event and a client reading the API see one message representation)."""

from rest_framework import serializers

from conversations.models import Conversation, Message, Turn


class MessageOutputSerializer(serializers.ModelSerializer):
    conversation_id = serializers.UUIDField(read_only=True)
    turn_id = serializers.UUIDField(read_only=True, allow_null=True)
    parent_id = serializers.UUIDField(read_only=True, allow_null=True)

    class Meta:
        model = Message
        fields = [
            "id",
            "conversation_id",
            "seq",
            "turn_id",
            "parent_id",
            "role",
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


class TurnOutputSerializer(serializers.ModelSerializer):
    conversation_id = serializers.UUIDField(read_only=True)

    class Meta:
        model = Turn
        fields = ["id", "conversation_id", "index", "status", "started_at", "ended_at"]
        read_only_fields = fields


class ConversationOutputSerializer(serializers.ModelSerializer):
    end_user = serializers.SlugRelatedField(slug_field="external_id", read_only=True, allow_null=True)
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
