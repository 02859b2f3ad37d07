"""REST endpoints for conversations, messages, turns and transcripts. Views validate, call one service and
render; every object is fetched through the caller's tenant."""

import contextlib
from typing import Any

from django.conf import settings
from django.http import StreamingHttpResponse
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.exceptions import ErrorDetail, ParseError, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations import services
from conversations.models import Message
from conversations.parts import PART_TYPES, parts_validate
from conversations.selectors import (
    access_conversation,
    access_message,
    access_turn,
    conversation_list,
    message_list,
)
from conversations.serializers import (
    ConversationDetailOutputSerializer,
    ConversationOutputSerializer,
    MessageBatchOutputSerializer,
    MessageOutputSerializer,
    TurnOutputSerializer,
)
from conversations.transcript import transcript_export, transcript_import
from tenants.api import (
    CONFLICT_RESPONSES,
    LimitedJSONParser,
    LimitedMultiPartParser,
    RawBodyParser,
    StrictBooleanField,
    StrictSerializer,
    cursor_page,
    error_responses,
    json_body,
    validated,
)
from tenants.errors import ApplicationError
from tenants.validation import INT64_MAX


@extend_schema_field({"type": "object", "additionalProperties": True})
class MetadataField(serializers.JSONField):
    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValidationError([ErrorDetail("Must be a JSON object.", code="invalid_metadata")])
        return super().to_internal_value(data)


@extend_schema_field(
    {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"type": "string", "enum": list(PART_TYPES)}},
            "additionalProperties": True,
        },
        "description": "text {text}; image {image_id | data + media_type | upload, detail?, role?, "
        "description?}; tool_call {id, name, arguments}; tool_result {tool_call_id, content, is_error?, "
        "name?}.",
    }
)
class PartsField(serializers.JSONField):
    def to_internal_value(self, data: Any) -> Any:
        return parts_validate(data)


class MessageTimeField(serializers.DateTimeField):
    """When the client says a message was written: an ISO 8601 string, with an offset or Z; a date alone is
    midnight and a time without an offset is UTC (not the server's zone: the server's zone says nothing
    about where an imported history happened). Stored in UTC."""

    def to_internal_value(self, data: Any) -> Any:
        parsed = None
        if isinstance(data, str):
            with contextlib.suppress(ValueError):  # well-formed but impossible: month 13, hour 25
                parsed = parse_datetime(data)
        if parsed is None:
            raise ValidationError(
                [
                    ErrorDetail(
                        "Must be an ISO 8601 time as a string, e.g. 2024-03-15T09:30:00Z or 2024-03-15.",
                        code="invalid_created_at",
                    )
                ]
            )
        try:
            return services.message_time_check(parsed)
        except ValueError as exc:
            reason = str(exc)
            raise ValidationError(
                [ErrorDetail(reason[:1].upper() + reason[1:], code="created_at_out_of_range")]
            ) from None


# --- conversations -----------------------------------------------------------------------------------------


class ConversationCursorPagination(CursorPagination):
    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 200

    def decode_cursor(self, request: Any) -> Any:
        try:
            return super().decode_cursor(request)
        except Exception as exc:
            raise ApplicationError("The cursor is not valid.", code="invalid_cursor") from exc


class ConversationListCreateApi(APIView):
    class InputSerializer(StrictSerializer):
        end_user = serializers.CharField(max_length=255, required=False)
        model = serializers.CharField(max_length=100, required=False)
        title = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")
        metadata = MetadataField(required=False, default=dict)

    class FilterSerializer(serializers.Serializer):
        end_user = serializers.CharField(
            max_length=255, required=False, help_text="Only conversations of this end user (external id)"
        )
        # Checked here: the paginator would ignore a limit it cannot read (-1, null) and use its default.
        limit = serializers.IntegerField(
            min_value=1, required=False, help_text="Page size (default 50; above 200 counts as 200)"
        )
        cursor = serializers.CharField(required=False, help_text="Cursor from the previous page's next link")

    @extend_schema(
        operation_id="conversations_list",
        parameters=[FilterSerializer],
        responses={200: cursor_page("ConversationPage", ConversationOutputSerializer), **error_responses()},
    )
    def get(self, request: Any) -> Response:
        # A plain dict: from a QueryDict, DRF reads an empty value (limit=) as absent.
        filters = validated(self.FilterSerializer, request.query_params.dict())
        qs = conversation_list(tenant=request.auth.tenant, end_user_external_id=filters.get("end_user"))
        paginator = ConversationCursorPagination()
        page = paginator.paginate_queryset(qs, request, view=self)
        return paginator.get_paginated_response(ConversationOutputSerializer(page, many=True).data)

    @extend_schema(
        request=InputSerializer, responses={201: ConversationOutputSerializer, **error_responses()}
    )
    def post(self, request: Any) -> Response:
        data = validated(self.InputSerializer, request.data)
        conversation = services.conversation_create(
            tenant=request.auth.tenant,
            end_user_external_id=data.get("end_user"),
            model=data.get("model"),
            title=data["title"],
            metadata=data["metadata"],
        )
        return Response(ConversationOutputSerializer(conversation).data, status=status.HTTP_201_CREATED)


class ConversationDetailApi(APIView):
    class InputSerializer(StrictSerializer):
        title = serializers.CharField(max_length=300, required=False, allow_blank=True)
        model = serializers.CharField(max_length=100, required=False)
        metadata = MetadataField(required=False)
        archived = StrictBooleanField(required=False)

    @extend_schema(responses={200: ConversationDetailOutputSerializer, **error_responses()})
    def get(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        return Response(ConversationDetailOutputSerializer(conversation).data)

    @extend_schema(
        request=InputSerializer, responses={200: ConversationOutputSerializer, **error_responses()}
    )
    def patch(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        data = validated(self.InputSerializer, request.data)
        conversation = services.conversation_update(conversation=conversation, **data)
        return Response(ConversationOutputSerializer(conversation).data)

    @extend_schema(responses={204: None, **error_responses()})
    def delete(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        services.conversation_delete(conversation=conversation)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- messages ----------------------------------------------------------------------------------------------


# Text fields checked by validate_role/validate_kind (with codes of their own); the schema names the values.
@extend_schema_field({"type": "string", "enum": Message.Role.values})
class RoleField(serializers.CharField):
    pass


@extend_schema_field({"type": "string", "enum": [Message.Kind.MESSAGE]})
class KindField(serializers.CharField):
    pass


@extend_schema_field(
    {
        "type": "string",
        "maxLength": services.MESSAGE_NAME_MAX,
        "nullable": True,
        "description": "The speaker (OpenAI's message name): who said it when several people or agents "
        "share a role. No control or format characters; surrounding whitespace is trimmed; empty, blank "
        "or null means none.",
    }
)
class MessageNameField(serializers.Field):
    """A speaker's name, every refusal coded invalid_name (a CharField would answer a number or a null with
    codes of its own, before any check of ours)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(required=False, default="", **kwargs)

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data is serializers.empty:
            return super().run_validation(data)
        return self.to_internal_value(data)

    def to_internal_value(self, data: Any) -> str:
        try:
            return services.message_name_check(data)
        except ValueError as exc:
            reason = str(exc)
            raise ValidationError(
                [ErrorDetail(reason[:1].upper() + reason[1:], code="invalid_name")]
            ) from None

    def to_representation(self, value: Any) -> Any:
        # Only the schema's default is rendered through here: messages go out by MessageOutputSerializer.
        return value


class MessageInputSerializer(StrictSerializer):
    role = RoleField()
    name = MessageNameField()
    kind = KindField(required=False, default=Message.Kind.MESSAGE)
    content = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    # DRF's stubs type a JSONField's default a mapping; parts are a list.
    parts = PartsField(required=False, default=list)  # type: ignore[arg-type]
    completed = StrictBooleanField(required=False, default=True)
    is_error = StrictBooleanField(required=False, default=False)
    idempotency_key = serializers.CharField(max_length=255, required=False)
    turn_id = serializers.UUIDField(required=False)
    parent_id = serializers.UUIDField(required=False)
    metadata = MetadataField(required=False, default=dict)
    created_at = MessageTimeField(
        required=False,
        help_text="When the message was written (ISO 8601 with an offset or Z; a date alone is midnight UTC, "
        "a time without an offset is UTC); from 1970 to a day ahead. Default: now. Order stays by seq.",
    )
    usage = serializers.DictField(
        required=False,
        help_text="On an assistant message: the provider's usage object, as returned, for cache accounting.",
    )

    def validate_role(self, value: str) -> str:
        if value not in Message.Role.values:
            raise ValidationError(
                f"Unknown role {value!r}; expected one of {', '.join(Message.Role.values)}.",
                code="invalid_role",
            )
        return value

    def validate_kind(self, value: str) -> str:
        if value != Message.Kind.MESSAGE:
            # Boundaries and summaries are written by compaction (or arrive through a transcript import).
            raise ValidationError(
                f"kind {value!r} cannot be appended; only 'message' can (compaction writes the others).",
                code="invalid_kind",
            )
        return value


class MessageBatchInputSerializer(StrictSerializer):
    messages = serializers.ListField(child=MessageInputSerializer(), allow_empty=False)


# The body of an append is one message or a batch; so is the answer.
MESSAGE_APPEND_REQUEST = PolymorphicProxySerializer(
    component_name="MessageAppend",
    serializers=[MessageInputSerializer, MessageBatchInputSerializer],
    resource_type_field_name=None,
    many=False,
)
MESSAGE_APPEND_MULTIPART = inline_serializer(
    "MessageAppendMultipart",
    {
        "message": serializers.CharField(
            help_text="The JSON message (or batch); its image parts name uploaded files by field name."
        )
    },
)
MESSAGE_APPEND_RESPONSE = PolymorphicProxySerializer(
    component_name="MessageAppended",
    serializers=[MessageOutputSerializer, MessageBatchOutputSerializer],
    resource_type_field_name=None,
    many=False,
)


def _multipart_message(request: Any) -> tuple[Any, dict[str, Any]]:
    """A multipart append: the "message" field holds the JSON message (or batch); image parts name the
    uploaded files with {"type": "image", "upload": "<field>"}."""
    unknown = sorted(set(request.data) - {"message"} - set(request.FILES))
    if unknown:
        raise ValidationError({key: [ErrorDetail("Unknown field.", code="unknown_field")] for key in unknown})
    raw = request.data.get("message")
    if raw is None:
        raise ValidationError(
            {"message": [ErrorDetail("A multipart append needs a JSON 'message' field.", code="required")]}
        )
    if not isinstance(raw, str):
        raise ApplicationError("The 'message' field is not valid JSON.", code="malformed_json")
    try:
        message = json_body(raw)
    except ParseError:
        raise ApplicationError("The 'message' field is not valid JSON.", code="malformed_json") from None
    return message, dict(request.FILES.items())


class MessageListCreateApi(APIView):
    parser_classes = [LimitedJSONParser, LimitedMultiPartParser]

    class FilterSerializer(serializers.Serializer):
        after_seq = serializers.IntegerField(
            min_value=0,
            max_value=INT64_MAX,
            required=False,
            default=0,
            help_text="Return messages with seq greater than this",
        )
        limit = serializers.IntegerField(
            min_value=1, max_value=1000, required=False, default=100, help_text="At most this many"
        )

    @extend_schema(
        operation_id="conversations_messages_list",
        parameters=[FilterSerializer],
        responses={
            200: inline_serializer(
                "MessagePage",
                {
                    "messages": MessageOutputSerializer(many=True),
                    "next_after_seq": serializers.IntegerField(allow_null=True),
                    "has_more": serializers.BooleanField(),
                },
            ),
            **error_responses(),
        },
    )
    def get(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        filters = validated(self.FilterSerializer, request.query_params.dict())
        rows = message_list(
            conversation=conversation, after_seq=filters["after_seq"], limit=filters["limit"] + 1
        )
        has_more = len(rows) > filters["limit"]
        rows = rows[: filters["limit"]]
        return Response(
            {
                "messages": MessageOutputSerializer(rows, many=True).data,
                "next_after_seq": rows[-1].seq if rows else None,
                "has_more": has_more,
            }
        )

    @extend_schema(
        request={
            "application/json": MESSAGE_APPEND_REQUEST,
            "multipart/form-data": MESSAGE_APPEND_MULTIPART,
        },
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                description="A retry with the same key returns the original message(s) with 200. "
                "For a batch, message i gets the key '<key>:<i>'.",
            )
        ],
        description='Append one message, or a batch with `{"messages": [...]}` (all or nothing). Image parts '
        'carry base64 (`{"type":"image","data":…,"media_type":"image/png"}`) or, in a multipart/form-data '
        'request whose "message" field holds the JSON, name an uploaded file (`{"type":"image","upload":'
        '"<field>"}`); they are validated, hashed, deduplicated and stored, and the stored part names the '
        "image (`image_id`, `duplicate_of` when it repeats the previous screen).",
        responses={
            201: MESSAGE_APPEND_RESPONSE,
            200: OpenApiResponse(MESSAGE_APPEND_RESPONSE, description="Replay of an earlier request"),
            **error_responses(CONFLICT_RESPONSES),
        },
    )
    def post(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        header_key = request.headers.get("Idempotency-Key")
        if header_key is not None and not 0 < len(header_key) <= 200:
            raise ApplicationError(
                "Idempotency-Key must be 1 to 200 characters.", code="invalid_idempotency_key"
            )
        data, uploads = request.data, None
        if (request.content_type or "").startswith("multipart/form-data"):
            data, uploads = _multipart_message(request)
        is_batch = isinstance(data, dict) and "messages" in data
        if is_batch:
            items = validated(MessageBatchInputSerializer, data)["messages"]
        else:
            items = [validated(MessageInputSerializer, data)]
        results = services.message_append_batch(
            conversation=conversation, items=items, idempotency_key=header_key, uploads=uploads
        )
        code = status.HTTP_201_CREATED if any(r.created for r in results) else status.HTTP_200_OK
        if is_batch:
            body = {"messages": MessageOutputSerializer([r.message for r in results], many=True).data}
            return Response(body, status=code)
        return Response(MessageOutputSerializer(results[0].message).data, status=code)


class MessageDetailApi(APIView):
    class InputSerializer(StrictSerializer):
        completed = StrictBooleanField(required=False)
        content = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
        parts = PartsField(required=False)
        metadata = MetadataField(required=False)

    @extend_schema(responses={200: MessageOutputSerializer, **error_responses()})
    def get(self, request: Any, conversation_id: str, message_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        message = access_message(conversation=conversation, message_id=message_id)
        return Response(MessageOutputSerializer(message).data)

    @extend_schema(
        request=InputSerializer,
        description="Mark a message completed, or amend an incomplete one. "
        "A completed message is final (409).",
        responses={200: MessageOutputSerializer, **error_responses(CONFLICT_RESPONSES)},
    )
    def patch(self, request: Any, conversation_id: str, message_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        message = access_message(conversation=conversation, message_id=message_id)
        data = validated(self.InputSerializer, request.data)
        message = services.message_update(message=message, **data)
        return Response(MessageOutputSerializer(message).data)


# --- turns -------------------------------------------------------------------------------------------------


class TurnStartApi(APIView):
    @extend_schema(request=None, responses={201: TurnOutputSerializer, **error_responses()})
    def post(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        if request.data:
            raise ValidationError(
                {key: [ErrorDetail("Unknown field.", code="unknown_field")] for key in request.data}
                if isinstance(request.data, dict)
                else [ErrorDetail("Expected no body or an empty object.", code="invalid")]
            )
        turn = services.turn_start(conversation=conversation)
        return Response(TurnOutputSerializer(turn).data, status=status.HTTP_201_CREATED)


class TurnEndApi(APIView):
    @extend_schema(request=None, responses={200: TurnOutputSerializer, **error_responses()})
    def post(self, request: Any, conversation_id: str, turn_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        turn = access_turn(conversation=conversation, turn_id=turn_id)
        turn = services.turn_end(turn=turn)
        return Response(TurnOutputSerializer(turn).data)


# --- transcripts -------------------------------------------------------------------------------------------


class TranscriptExportApi(APIView):
    @extend_schema(
        responses={(200, "application/x-ndjson"): OpenApiTypes.STR, **error_responses()},
        description="The whole transcript as JSON Lines "
        "(a header line, then one line per message in seq order).",
    )
    def get(self, request: Any, conversation_id: str) -> StreamingHttpResponse:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        # Served through the WSGI handler (config/asgi.py): the server sends page by page as the iterator
        # yields, on the request's thread.
        response = StreamingHttpResponse(
            transcript_export(conversation), content_type="application/x-ndjson; charset=utf-8"
        )
        response["Content-Disposition"] = f'attachment; filename="{conversation.id}.jsonl"'
        return response


class TranscriptImportApi(APIView):
    parser_classes = [RawBodyParser]

    @extend_schema(
        request={"application/x-ndjson": OpenApiTypes.STR},
        responses={201: ConversationOutputSerializer, **error_responses()},
        description="Create a new conversation from a transcript exported by GET …/transcript.jsonl "
        "(or any file of that shape). All or nothing.",
    )
    def post(self, request: Any) -> Response:
        data = request.data if isinstance(request.data, bytes) else b""
        conversation = transcript_import(
            tenant=request.auth.tenant, data=data, max_message_bytes=settings.MNEMO_MAX_MESSAGE_BYTES
        )
        return Response(ConversationOutputSerializer(conversation).data, status=status.HTTP_201_CREATED)
