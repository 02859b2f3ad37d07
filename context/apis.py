"""REST endpoints: the context call, agent profiles and their assignment to conversations."""

import time
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ErrorDetail
from rest_framework.response import Response
from rest_framework.views import APIView

from context import services
from context.models import AgentProfile
from context.pipeline import context_assemble
from context.selectors import access_agent_profile
from context.serializers import (
    AgentProfileListOutputSerializer,
    AgentProfileOutputSerializer,
    ContextOutputSerializer,
    ConversationAgentProfileOutputSerializer,
    context_payload,
)
from context.state import ContextRequest
from conversations.selectors import access_conversation
from prefix_cache.rendering import FORMATS
from prefix_cache.services import context_call_note
from tenants.api import (
    CONFLICT_RESPONSES,
    StrictBooleanField,
    StrictSerializer,
    error_responses,
    validated,
)
from tenants.validation import INT32_MAX


class AttachmentSerializer(StrictSerializer):
    name = serializers.CharField(max_length=300)
    description = serializers.CharField(required=False, allow_blank=True, max_length=4000)
    content = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)


class RetrievalSerializer(StrictSerializer):
    enabled = StrictBooleanField(required=False, default=True)
    top_k = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=200,
        help_text="At most this many retrieved messages and memories (default: as many as the budget holds).",
    )


class ContextApi(APIView):
    class InputSerializer(StrictSerializer):
        user_message = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
        user_message_id = serializers.UUIDField(required=False)
        token_budget = serializers.IntegerField(required=False, min_value=256, max_value=INT32_MAX)
        model = serializers.CharField(required=False, max_length=100)
        format = serializers.ChoiceField(choices=FORMATS, required=False)
        attachments = serializers.ListField(
            child=AttachmentSerializer(), required=False, default=list, max_length=50
        )
        retrieval = RetrievalSerializer(required=False)
        agent_profile = serializers.UUIDField(required=False)

        openapi_request_extra = {  # exactly one of the two (config/schema.py)
            "oneOf": [{"required": ["user_message"]}, {"required": ["user_message_id"]}]
        }

        def validate(self, data: dict[str, Any]) -> dict[str, Any]:
            if ("user_message" in data) == ("user_message_id" in data):
                raise serializers.ValidationError(
                    "Give exactly one of user_message (text not yet stored) or user_message_id "
                    "(a stored user message; the history then stops before it).",
                    code="invalid_user_message",
                )
            # The user message and its attachments are the current message of the prompt: held to the limit
            # of a stored message, so one request cannot ask for a million-token prompt.
            size = len(data.get("user_message", "").encode()) + sum(
                len(a.get("content", "").encode()) + len(a.get("description", "").encode())
                for a in data["attachments"]
            )
            limit = settings.MNEMO_MAX_MESSAGE_BYTES
            if size > limit:
                raise serializers.ValidationError(
                    {
                        "user_message": ErrorDetail(
                            f"The user message and its attachments are {size} bytes; the limit is {limit}.",
                            code="message_too_large",
                        )
                    }
                )
            return data

    @extend_schema(
        request=InputSerializer,
        responses={
            200: ContextOutputSerializer,
            **error_responses(),
        },
        description="Assemble the prompt for the next model call: B1 + B2a + B4 in the system message, "
        "then B6 history and the current user message, inside the token budget. `context_id` identifies "
        "the call when its provider usage is reported.",
    )
    def post(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        data = validated(self.InputSerializer, request.data)
        started = time.perf_counter()
        state = context_assemble(
            conversation=conversation,
            request=ContextRequest(
                user_message=data.get("user_message", ""),
                user_message_id=data.get("user_message_id"),
                token_budget=data.get("token_budget"),
                model=data.get("model"),
                format=data.get("format"),
                attachments=data["attachments"],
                retrieval=dict(data.get("retrieval") or {}),
                agent_profile_id=data.get("agent_profile"),
            ),
        )
        payload = context_payload(state)
        # The dashboard's latency and degradation charts per tenant (prefix_cache.ContextCallHour).
        context_call_note(
            tenant_id=conversation.tenant_id,
            milliseconds=(time.perf_counter() - started) * 1000,
            degradation_codes=[d.code for d in state.degradations],
        )
        return Response(payload)


class AgentProfileListCreateApi(APIView):
    class InputSerializer(StrictSerializer):
        name = serializers.CharField(max_length=100)
        scope = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
        policy = serializers.CharField(required=False, allow_blank=True, default="", max_length=20000)
        is_default = StrictBooleanField(required=False, default=False)

    @extend_schema(
        operation_id="agent_profiles_list",
        responses={200: AgentProfileListOutputSerializer, **error_responses()},
    )
    def get(self, request: Any) -> Response:
        profiles = AgentProfile.objects.filter(tenant=request.auth.tenant).order_by("name")
        return Response({"results": AgentProfileOutputSerializer(profiles, many=True).data})

    @extend_schema(
        request=InputSerializer,
        responses={201: AgentProfileOutputSerializer, **error_responses(CONFLICT_RESPONSES)},
    )
    def post(self, request: Any) -> Response:
        data = validated(self.InputSerializer, request.data)
        profile = services.agent_profile_create(tenant=request.auth.tenant, **data)
        return Response(AgentProfileOutputSerializer(profile).data, status=status.HTTP_201_CREATED)


class AgentProfileDetailApi(APIView):
    class InputSerializer(StrictSerializer):
        name = serializers.CharField(max_length=100, required=False)
        scope = serializers.CharField(max_length=500, required=False, allow_blank=True)
        policy = serializers.CharField(required=False, allow_blank=True, max_length=20000)
        is_default = StrictBooleanField(required=False)

    @extend_schema(responses={200: AgentProfileOutputSerializer, **error_responses()})
    def get(self, request: Any, profile_id: str) -> Response:
        profile = access_agent_profile(tenant=request.auth.tenant, profile_id=profile_id)
        return Response(AgentProfileOutputSerializer(profile).data)

    @extend_schema(
        request=InputSerializer,
        responses={200: AgentProfileOutputSerializer, **error_responses(CONFLICT_RESPONSES)},
    )
    def patch(self, request: Any, profile_id: str) -> Response:
        profile = access_agent_profile(tenant=request.auth.tenant, profile_id=profile_id)
        data = validated(self.InputSerializer, request.data)
        profile = services.agent_profile_update(profile=profile, **data)
        return Response(AgentProfileOutputSerializer(profile).data)

    @extend_schema(responses={204: None, **error_responses()})
    def delete(self, request: Any, profile_id: str) -> Response:
        profile = access_agent_profile(tenant=request.auth.tenant, profile_id=profile_id)
        profile.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class ConversationAgentProfileApi(APIView):
    class InputSerializer(StrictSerializer):
        agent_profile = serializers.UUIDField(allow_null=True)

    @extend_schema(
        request=InputSerializer,
        responses={200: ConversationAgentProfileOutputSerializer, **error_responses()},
        description="Assign an agent profile to the conversation (null: back to the tenant's default).",
    )
    def put(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        data = validated(self.InputSerializer, request.data)
        profile = None
        if data["agent_profile"] is not None:
            profile = access_agent_profile(tenant=request.auth.tenant, profile_id=data["agent_profile"])
        services.conversation_agent_profile_set(conversation=conversation, profile=profile)
        return Response({"agent_profile": AgentProfileOutputSerializer(profile).data if profile else None})
