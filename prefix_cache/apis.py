"""REST endpoints: provider usage reports and cache statistics."""

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.selectors import access_conversation
from prefix_cache.selectors import GROUPS, cache_stats
from prefix_cache.services import cache_usage_report
from prefix_cache.usage import PROVIDERS
from tenants.api import CONFLICT_RESPONSES, StrictSerializer, error_responses, validated


class CacheUsageOutputSerializer(serializers.Serializer):
    context_id = serializers.UUIDField(source="id")
    provider = serializers.CharField()
    model = serializers.CharField()
    prompt_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField()
    cache_write_tokens = serializers.IntegerField(allow_null=True)
    completion_tokens = serializers.IntegerField(allow_null=True)
    predicted_prompt_tokens = serializers.IntegerField()
    predicted_cacheable_tokens = serializers.IntegerField()
    hint_level = serializers.CharField()


@extend_schema_field({"type": "object", "additionalProperties": True})
class UsageObjectField(serializers.JSONField):
    """Any JSON here; usage_parse answers 400 invalid_usage for what is not a usage object."""


class CacheStatsRowSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="The model, the day (YYYY-MM-DD) or the conversation id.")
    requests = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField()
    cache_write_tokens = serializers.IntegerField()
    hit_rate = serializers.FloatField()
    predicted_cacheable_tokens = serializers.IntegerField()
    prediction_mean_abs_error_tokens = serializers.FloatField()
    prediction_error_rate = serializers.FloatField()
    savings_usd = serializers.FloatField()
    unpriced_models = serializers.ListField(child=serializers.CharField())


class CacheStatsOutputSerializer(serializers.Serializer):
    group_by = serializers.ChoiceField(choices=GROUPS)
    results = CacheStatsRowSerializer(many=True)


class UsageApi(APIView):
    class InputSerializer(StrictSerializer):
        usage = UsageObjectField(help_text="The provider's usage object (or whole response), as returned.")
        provider = serializers.ChoiceField(choices=PROVIDERS, required=False)
        context_id = serializers.UUIDField(required=False)

    @extend_schema(
        request=InputSerializer,
        responses={200: CacheUsageOutputSerializer, **error_responses(CONFLICT_RESPONSES)},
        description="Record the provider's usage for a context call (by `context_id`, else the "
        "conversation's latest call still waiting): OpenAI `prompt_tokens_details.cached_tokens`, Anthropic "
        "`cache_read_input_tokens`/`cache_creation_input_tokens`, Gemini `cachedContentTokenCount`.",
    )
    def post(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        data = validated(self.InputSerializer, request.data)
        row = cache_usage_report(
            conversation=conversation,
            usage=data["usage"],
            provider=data.get("provider"),
            context_id=data.get("context_id"),
        )
        return Response(CacheUsageOutputSerializer(row).data)


class CacheStatsApi(APIView):
    class FilterSerializer(StrictSerializer):
        group_by = serializers.ChoiceField(choices=GROUPS, required=False, default="model")
        since = serializers.DateTimeField(required=False, help_text="ISO 8601, inclusive")
        until = serializers.DateTimeField(required=False, help_text="ISO 8601, exclusive")

    @extend_schema(
        operation_id="prefix_cache_stats",
        parameters=[FilterSerializer],
        responses={200: CacheStatsOutputSerializer, **error_responses()},
    )
    def get(self, request: Any) -> Response:
        filters = validated(self.FilterSerializer, request.query_params.dict())
        rows = cache_stats(
            tenant=request.auth.tenant,
            group_by=filters["group_by"],
            since=filters.get("since"),
            until=filters.get("until"),
        )
        return Response({"group_by": filters["group_by"], "results": rows})
