"""REST endpoints: manual compaction (/compact) and the conversation's summary segments."""

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.selectors import access_conversation
from summaries.locks import LockBusy
from summaries.models import SummarySegment
from summaries.selectors import compaction_status
from summaries.services import CompactionStale, compaction_run, outcome_data, segment_data
from tenants.api import CONFLICT_RESPONSES, StrictSerializer, error_responses, optional_body, validated
from tenants.errors import ApplicationError

SEGMENT_SCHEMA = inline_serializer(
    "SummarySegment",
    {
        "id": serializers.UUIDField(),
        "start_seq": serializers.IntegerField(),
        "end_seq": serializers.IntegerField(),
        "level": serializers.IntegerField(),
        "source": serializers.ChoiceField(choices=SummarySegment.Source.values),
        "built_from": serializers.ChoiceField(choices=SummarySegment.BuiltFrom.values),
        "model": serializers.CharField(),
        "template_version": serializers.CharField(),
        "token_count": serializers.IntegerField(),
        "facts_checked": serializers.IntegerField(),
        "facts_missing": serializers.IntegerField(),
        "text": serializers.CharField(),
        "superseded_by": serializers.UUIDField(allow_null=True),
        "created_at": serializers.DateTimeField(),
    },
)

COMPACTION_STATUS_SCHEMA = inline_serializer(
    "CompactionStatus",
    {
        "status": serializers.ChoiceField(
            choices=["running", "queued", "failed", "idle"],
            help_text="failed: the last run failed (last_error); the periodic catch-up retries it.",
        ),
        "compactions": serializers.IntegerField(),
        "failures": serializers.IntegerField(help_text="Failed or interrupted runs, ever."),
        "last_run_at": serializers.DateTimeField(allow_null=True),
        "last_source": serializers.CharField(allow_null=True),
        "last_failed_at": serializers.DateTimeField(allow_null=True),
        "last_error": serializers.CharField(allow_null=True, help_text="Cleared by the next successful run."),
        "running_since": serializers.DateTimeField(allow_null=True),
        "queued_at": serializers.DateTimeField(allow_null=True),
        "history_budget": serializers.IntegerField(
            allow_null=True,
            help_text="Tokens of history the latest context request that queued a compaction could show; "
            "queued runs and the catch-up sweep compact at their share of it (null: the tenant's "
            "history_token_budget).",
        ),
        "summary_budget": serializers.IntegerField(
            allow_null=True,
            help_text="The summaries' share of that request's budget; runs roll them up to fit it (null: "
            "the tenant's summary_token_budget).",
        ),
    },
)

COMPACTION_SCHEMA = inline_serializer(
    "Compaction",
    {
        "trigger": serializers.CharField(),
        "source": serializers.ChoiceField(choices=SummarySegment.Source.values),
        "tokens_before": serializers.IntegerField(help_text="B4 + B6 tokens before"),
        "tokens_after": serializers.IntegerField(help_text="B4 + B6 tokens after"),
        "ratio": serializers.FloatField(help_text="tokens_after / tokens_before"),
        "boundary": serializers.DictField(),
        "segment": SEGMENT_SCHEMA,
        "segments": serializers.ListField(child=serializers.DictField()),
        "rollups": serializers.ListField(child=serializers.DictField()),
        "superseded": serializers.ListField(child=serializers.UUIDField()),
        "attachments": serializers.ListField(child=serializers.DictField()),
        "messages_summarised": serializers.IntegerField(),
        "messages_kept": serializers.IntegerField(),
        "skipped_incomplete": serializers.IntegerField(),
        "elapsed_ms": serializers.FloatField(),
        "degradations": serializers.ListField(child=serializers.DictField()),
    },
)


class CompactApi(APIView):
    class InputSerializer(StrictSerializer):
        instructions = serializers.CharField(required=False, allow_blank=True, max_length=4000, default="")

    @extend_schema(
        request=InputSerializer,
        responses={
            200: COMPACTION_SCHEMA,
            **error_responses(
                CONFLICT_RESPONSES,
                {409: OpenApiResponse(description="nothing_to_compact or compaction_in_progress")},
            ),
        },
        description="Compact now: summarise the oldest messages since the last boundary (all but the newest "
        "20 % by tokens) into a new summary segment, write a compact_boundary and compact_summary into the "
        "transcript, and move the boundary. `instructions` steer the summary. Raw messages are never "
        "deleted.",
    )
    def post(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        data = validated(self.InputSerializer, optional_body(request))
        try:
            outcome = compaction_run(
                conversation=conversation, trigger="manual", instructions=data["instructions"], sync=True
            )
        except (LockBusy, CompactionStale):
            raise ApplicationError(
                "A compaction of this conversation is running; try again in a moment.",
                code="compaction_in_progress",
                status_code=status.HTTP_409_CONFLICT,
            ) from None
        if outcome is None:
            raise ApplicationError(
                "Nothing to compact: the history since the last boundary is too short.",
                code="nothing_to_compact",
                status_code=status.HTTP_409_CONFLICT,
            )
        return Response(outcome_data(outcome))


class SummarySegmentListApi(APIView):
    class FilterSerializer(serializers.Serializer):
        all = serializers.BooleanField(required=False, default=False)

    @extend_schema(
        parameters=[OpenApiParameter("all", bool, description="Include superseded segments")],
        responses={
            200: inline_serializer(
                "SummarySegmentList",
                {
                    "results": serializers.ListField(child=SEGMENT_SCHEMA),
                    "compaction": COMPACTION_STATUS_SCHEMA,
                },
            ),
            **error_responses(),
        },
        description="The conversation's summary segments (B4), oldest first, and the state of its "
        "compaction (a failed or interrupted run shows here until a run succeeds).",
    )
    def get(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        filters = validated(self.FilterSerializer, request.query_params)
        qs = SummarySegment.objects.filter(conversation=conversation)
        if not filters["all"]:
            qs = qs.filter(superseded_by__isnull=True)
        return Response(
            {
                "results": [segment_data(s) for s in qs.order_by("start_seq", "level", "created_at")],
                "compaction": compaction_status(conversation),
            }
        )
