"""REST endpoints: provider usage reports and cache statistics."""

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
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


class UsageApi(APIView):
    class InputSerializer(StrictSerializer):
        usage = serializers.JSONField(
            help_text="The provider's usage object (or whole response), as returned."
        )
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
        since = serializers.DateTimeField(required=False)
        until = serializers.DateTimeField(required=False)

    @extend_schema(
        parameters=[
            OpenApiParameter("group_by", str, enum=list(GROUPS)),
            OpenApiParameter("since", str, description="ISO 8601, inclusive"),
            OpenApiParameter("until", str, description="ISO 8601, exclusive"),
        ],
        responses={
            200: inline_serializer("CacheStats", {"results": serializers.ListField()}),
            **error_responses(),
        },
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
