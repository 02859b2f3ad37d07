"""Output shapes of the context call and the agent profiles. The context body is built by
context.pipeline.context_payload; these serializers document it (and `make schema-check` holds every
response to them)."""

from rest_framework import serializers

from context.models import AgentProfile
from prefix_cache.rendering import FORMATS
from tenants.api import DegradationSerializer


class ContextTokensSerializer(serializers.Serializer):
    system = serializers.IntegerField()
    history = serializers.IntegerField()
    user = serializers.IntegerField()
    total = serializers.IntegerField()
    exact = serializers.BooleanField(help_text="False when the model's tokenizer is not known (estimated).")


class ContextBlockSerializer(serializers.Serializer):
    tokens = serializers.IntegerField()
    sha256 = serializers.CharField(help_text="Of the block's rendered text: equal hashes, equal bytes.")
    items = serializers.ListField(
        child=serializers.DictField(), help_text="What the block holds, each with its `kind` and `tokens`."
    )
    from_seq = serializers.IntegerField(required=False, help_text="B6 only: the first message shown.")
    to_seq = serializers.IntegerField(required=False, help_text="B6 only: the last message shown.")


class CacheablePrefixTokensSerializer(serializers.Serializer):
    openai = serializers.IntegerField()
    anthropic = serializers.IntegerField()
    gemini = serializers.IntegerField()


class ContextPrefixSerializer(serializers.Serializer):
    hashes = serializers.DictField(child=serializers.CharField(), help_text="Layered prefix hashes by level.")
    tokens = serializers.DictField(child=serializers.IntegerField())
    hint_level = serializers.CharField(allow_null=True, help_text="The longest level seen before.")
    cached_history_messages = serializers.IntegerField()
    predicted_cached_tokens = serializers.IntegerField()
    cacheable_prefix_tokens = CacheablePrefixTokensSerializer()


class ContextWindowSerializer(serializers.Serializer):
    boundary_seq = serializers.IntegerField()
    window_start_seq = serializers.IntegerField()


class ContextOutputSerializer(serializers.Serializer):
    context_id = serializers.UUIDField(help_text="Name it when reporting the provider's usage.")
    model = serializers.CharField()
    format = serializers.ChoiceField(choices=FORMATS)
    system = serializers.JSONField(
        help_text="The system prompt in the format's shape: a string (openai), a list of text blocks with "
        "cache_control (anthropic), or a {parts} object (gemini)."
    )
    messages = serializers.ListField(
        child=serializers.DictField(),
        help_text="The messages to send, in the format's shape (openai includes the system message).",
    )
    token_budget = serializers.IntegerField()
    tokens = ContextTokensSerializer()
    blocks = serializers.DictField(
        child=ContextBlockSerializer(),
        help_text="By block: B1, B2a, B4, B6, B5, B3, B2b, memory_updates, attachments, user (only those "
        "present).",
    )
    dropped = serializers.ListField(
        child=serializers.DictField(), help_text="What the budget left out: `block`, `reason`, `tokens`…"
    )
    prefix = ContextPrefixSerializer()
    window = ContextWindowSerializer()
    timings = serializers.DictField(child=serializers.FloatField(), help_text="Milliseconds by stage.")
    degradations = DegradationSerializer(many=True)


class AgentProfileOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = AgentProfile
        fields = ["id", "name", "scope", "policy", "is_default", "version", "created_at", "updated_at"]
        read_only_fields = fields


class AgentProfileListOutputSerializer(serializers.Serializer):
    results = AgentProfileOutputSerializer(many=True)


class ConversationAgentProfileOutputSerializer(serializers.Serializer):
    agent_profile = AgentProfileOutputSerializer(allow_null=True)
