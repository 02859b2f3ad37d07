"""Output shapes of the context call and the agent profiles. ContextOutputSerializer renders the context
body from the pipeline's state (context_payload) and is its schema (`make schema-check` holds every
response to it); the blocks come from context/blocks.py."""

from typing import Any

from rest_framework import serializers

from context.blocks import context_blocks
from context.models import AgentProfile
from context.state import ContextState
from prefix_cache.rendering import FORMATS
from tenants.api import DegradationSerializer


class ContextTokensSerializer(serializers.Serializer[ContextState]):
    system = serializers.IntegerField(source="tokens.system")
    history = serializers.IntegerField(source="tokens.history")
    user = serializers.IntegerField(source="tokens.user")
    total = serializers.IntegerField(source="tokens.total")
    exact = serializers.BooleanField(
        source="info.exact_tokens", help_text="False when the model's tokenizer is not known (estimated)."
    )


class ReadyListField(serializers.ListField):
    """A list the pipeline built JSON-ready (dicts of strings, numbers and lists): rendered as it is, since
    walking every element of a large prompt again through its child field is most of the body's cost. The
    child field still describes the elements in the schema."""

    def to_representation(self, data: Any) -> list[Any]:
        return data if isinstance(data, list) else list(data)


class ContextBlockSerializer(serializers.Serializer[Any]):
    tokens = serializers.IntegerField()
    sha256 = serializers.CharField(help_text="Of the block's rendered text: equal hashes, equal bytes.")
    items = ReadyListField(
        child=serializers.DictField(), help_text="What the block holds, each with its `kind` and `tokens`."
    )
    from_seq = serializers.IntegerField(required=False, help_text="B6 only: the first message shown.")
    to_seq = serializers.IntegerField(required=False, help_text="B6 only: the last message shown.")


class CacheablePrefixTokensSerializer(serializers.Serializer[Any]):
    openai = serializers.IntegerField()
    anthropic = serializers.IntegerField()
    gemini = serializers.IntegerField()


class ContextPrefixSerializer(serializers.Serializer[Any]):
    hashes = serializers.DictField(child=serializers.CharField(), help_text="Layered prefix hashes by level.")
    tokens = serializers.DictField(child=serializers.IntegerField())
    hint_level = serializers.CharField(allow_null=True, help_text="The longest level seen before.")
    cached_history_messages = serializers.IntegerField()
    predicted_cached_tokens = serializers.IntegerField()
    cacheable_prefix_tokens = CacheablePrefixTokensSerializer()


class ContextWindowSerializer(serializers.Serializer[ContextState]):
    boundary_seq = serializers.IntegerField()
    window_start_seq = serializers.IntegerField(source="context.window_start_seq")


class ContextBlocksField(serializers.DictField):
    """The blocks, computed from the state when the body is rendered (context/blocks.py)."""

    def to_representation(self, value: Any) -> dict[str, Any]:  # the ContextState (source="*")
        return super().to_representation(context_blocks(value))


class DroppedField(serializers.ListField):
    """The drops, each as its type serialises it (context/dropped.py)."""

    def to_representation(self, data: Any) -> list[Any]:  # the state's list of Dropped
        return [d.data() for d in data]


# The context body, rendered from a ContextState after context_assemble; the field order is the body's key
# order. (A comment, not a docstring: the schema would publish a docstring as the body's description.)
class ContextOutputSerializer(serializers.Serializer[ContextState]):
    context_id = serializers.UUIDField(help_text="Name it when reporting the provider's usage.")
    model = serializers.CharField()
    format = serializers.ChoiceField(source="fmt", choices=FORMATS)
    system = serializers.JSONField(
        source="rendered.system",
        help_text="The system prompt in the format's shape: a string (openai), a list of text blocks with "
        "cache_control (anthropic), or a {parts} object (gemini).",
    )
    messages = ReadyListField(
        source="rendered.messages",
        child=serializers.DictField(),
        help_text="The messages to send, in the format's shape (openai includes the system message).",
    )
    token_budget = serializers.IntegerField(source="budget")
    tokens = ContextTokensSerializer(source="*")
    blocks = ContextBlocksField(
        source="*",
        child=ContextBlockSerializer(),
        help_text="By block: B1, B2a, B4, B6, B5, B3, B2b, memory_updates, attachments, user (only those "
        "present).",
    )
    dropped = DroppedField(
        child=serializers.DictField(), help_text="What the budget left out: `block`, `reason`, `tokens`…"
    )
    prefix = ContextPrefixSerializer()
    window = ContextWindowSerializer(source="*")
    timings = serializers.DictField(child=serializers.FloatField(), help_text="Milliseconds by stage.")
    degradations = DegradationSerializer(many=True)


# One instance renders every body: its bound fields are built once (a new serializer deep-copies its declared
# fields on each call, a large share of the body's cost), and rendering only reads them.
_CONTEXT_OUTPUT = ContextOutputSerializer()


def context_payload(state: ContextState) -> dict[str, Any]:
    """The response body: the prompt ready to send, and how it was made."""
    return _CONTEXT_OUTPUT.to_representation(state)


class AgentProfileOutputSerializer(serializers.ModelSerializer[AgentProfile]):
    class Meta:
        model = AgentProfile
        fields = ["id", "name", "scope", "policy", "is_default", "version", "created_at", "updated_at"]
        read_only_fields = fields


class AgentProfileListOutputSerializer(serializers.Serializer[Any]):
    results = AgentProfileOutputSerializer(many=True)


class ConversationAgentProfileOutputSerializer(serializers.Serializer[Any]):
    agent_profile = AgentProfileOutputSerializer(allow_null=True)
