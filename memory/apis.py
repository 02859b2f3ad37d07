"""REST endpoints of memory: core memory blocks (If-Match versions), the memory-operation log, task state
and its events, archival memories, and the end user's data (export, delete)."""

import re
from typing import Any

from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.selectors import access_conversation
from memory import archival, enduser, selectors, services, state
from memory import serializers as out
from memory.models import Actor, ArchivalMemory, StateEvent
from tenants.api import StrictSerializer, error_responses, validated
from tenants.errors import ApplicationError
from tenants.scoping import access_end_user, access_object
from tenants.services import end_user_get_or_create
from tenants.validation import INT32_MAX

LABEL_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
# What the label column (a SlugField) can hold, including labels an operator wrote in the admin.
STORED_LABEL_RE = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
PRECONDITION_RESPONSES = {
    412: OpenApiResponse(description="version_mismatch: the block changed since the If-Match version"),
    422: OpenApiResponse(description="over_char_limit"),
    428: OpenApiResponse(description="if_match_required: the block exists and no If-Match was sent"),
}
IF_MATCH = OpenApiParameter(
    "If-Match",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description='The version read, e.g. "3" (or W/"3", or 3)',
    pattern=r'^(W/)?"?[0-9]+"?$',
)
# A label as written (PUT creates the block) and as looked up (blocks an operator named in the admin too).
NEW_LABEL = OpenApiParameter("label", str, OpenApiParameter.PATH, pattern=LABEL_RE.pattern)
STORED_LABEL = OpenApiParameter("label", str, OpenApiParameter.PATH, pattern=STORED_LABEL_RE.pattern)


def _label(label: str) -> str:
    if not LABEL_RE.fullmatch(label):  # fullmatch: "$" alone would let a trailing newline through
        raise ApplicationError(
            "A label is lower-case letters, digits, '_' or '-', starting with a letter (at most 64).",
            code="invalid_label",
        )
    return label


def _stored_label(label: str) -> str:
    """A label to look up: one the column cannot hold (too long, a NUL) names no block, and is not sent to
    the database (PostgreSQL refuses a NUL even in a WHERE)."""
    if not STORED_LABEL_RE.fullmatch(label):
        raise ApplicationError(f"No core memory block {label[:64]!r}.", code="not_found", status_code=404)
    return label


def if_match_version(request: Any) -> int | None:
    """The version named by If-Match ("3", W/"3" or 3); None when absent or '*'."""
    raw = request.headers.get("If-Match")
    if raw is None or raw.strip() == "*":
        return None
    value = raw.strip().removeprefix("W/").strip('"')
    if not value.isdigit():
        raise ApplicationError('If-Match must name a block version, e.g. "3".', code="invalid_if_match")
    return int(value)


def _block_response(block: Any, *, status_code: int = 200) -> Response:
    response = Response(selectors.core_memory_block_data(block), status=status_code)
    response["ETag"] = f'"{block.version}"'
    return response


class CoreMemoryBlockListApi(APIView):
    @extend_schema(
        operation_id="users_memory_blocks_list",
        responses={200: out.CoreMemoryBlockListOutputSerializer, **error_responses()},
        description="The end user's core memory "
        "blocks in render order (persona, preferences, profile, then custom labels).",
    )
    def get(self, request: Any, external_id: str) -> Response:
        end_user = access_end_user(tenant=request.auth.tenant, external_id=external_id)
        blocks = selectors.core_memory_blocks(end_user=end_user)
        return Response({"blocks": [selectors.core_memory_block_data(b) for b in blocks]})


class CoreMemoryBlockDetailApi(APIView):
    class CoreMemoryPutSerializer(StrictSerializer):
        value = serializers.CharField(allow_blank=True, trim_whitespace=False, max_length=100_000)
        char_limit = serializers.IntegerField(required=False, min_value=1, max_value=100_000)
        reason = serializers.CharField(required=False, allow_blank=True, max_length=1000, default="")

    class CoreMemoryPatchSerializer(StrictSerializer):
        value = serializers.CharField(
            required=False, allow_blank=True, trim_whitespace=False, max_length=100_000
        )
        append = serializers.CharField(required=False, trim_whitespace=False, max_length=100_000)
        char_limit = serializers.IntegerField(required=False, min_value=1, max_value=100_000)
        reason = serializers.CharField(required=False, allow_blank=True, max_length=1000, default="")

        openapi_request_extra = {  # nothing_to_change without one of them (config/schema.py)
            "anyOf": [{"required": ["value"]}, {"required": ["append"]}, {"required": ["char_limit"]}]
        }

    @extend_schema(
        parameters=[STORED_LABEL], responses={200: out.CoreMemoryBlockOutputSerializer, **error_responses()}
    )
    def get(self, request: Any, external_id: str, label: str) -> Response:
        end_user = access_end_user(tenant=request.auth.tenant, external_id=external_id)
        block = end_user.memory_blocks.filter(label=_stored_label(label)).first()
        if block is None:
            raise ApplicationError(f"No core memory block {label!r}.", code="not_found", status_code=404)
        return _block_response(block)

    @extend_schema(
        request=CoreMemoryPutSerializer,
        parameters=[IF_MATCH, NEW_LABEL],
        responses={
            200: out.CoreMemoryBlockOutputSerializer,
            201: out.CoreMemoryBlockOutputSerializer,
            **error_responses(PRECONDITION_RESPONSES),
        },
        description="Create or replace a block. Replacing an existing block needs If-Match with its version.",
    )
    def put(self, request: Any, external_id: str, label: str) -> Response:
        _label(label)
        expected = if_match_version(request)
        data = validated(self.CoreMemoryPutSerializer, request.data)
        with transaction.atomic():
            end_user = end_user_get_or_create(tenant=request.auth.tenant, external_id=external_id)
            block, created = services.core_memory_write(
                end_user=end_user,
                label=label,
                value=data["value"],
                char_limit=data.get("char_limit"),
                expected_version=expected,
                actor=Actor.API,
                actor_name=f"api_key:{request.auth.name}",
                trigger=data["reason"],
            )
        return _block_response(block, status_code=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(
        request=CoreMemoryPatchSerializer,
        parameters=[IF_MATCH, STORED_LABEL],
        responses={200: out.CoreMemoryBlockOutputSerializer, **error_responses(PRECONDITION_RESPONSES)},
        description="Change a block: `value` replaces, `append` adds a line, `char_limit` resizes. "
        "Needs If-Match.",
    )
    def patch(self, request: Any, external_id: str, label: str) -> Response:
        expected = if_match_version(request)
        data = validated(self.CoreMemoryPatchSerializer, request.data)
        if not {"value", "append", "char_limit"} & set(data):
            raise ApplicationError("Send value, append or char_limit.", code="nothing_to_change")
        end_user = access_end_user(tenant=request.auth.tenant, external_id=external_id)
        block, _ = services.core_memory_write(
            end_user=end_user,
            label=_stored_label(label),
            value=data.get("value"),
            append=data.get("append"),
            char_limit=data.get("char_limit"),
            expected_version=expected,
            create=False,
            actor=Actor.API,
            actor_name=f"api_key:{request.auth.name}",
            trigger=data["reason"],
        )
        return _block_response(block)


class MemoryOperationListApi(APIView):
    class MemoryOperationFilterSerializer(StrictSerializer):
        limit = serializers.IntegerField(required=False, min_value=1, max_value=500, default=100)
        target = serializers.CharField(required=False, max_length=200)

    @extend_schema(
        parameters=[MemoryOperationFilterSerializer],
        responses={200: out.MemoryOperationListOutputSerializer, **error_responses()},
        description="Every change to the end user's memory, newest first: old and new value, who and why.",
    )
    def get(self, request: Any, external_id: str) -> Response:
        end_user = access_end_user(tenant=request.auth.tenant, external_id=external_id)
        params = validated(self.MemoryOperationFilterSerializer, request.query_params.dict())
        qs = selectors.memory_operations(end_user=end_user)
        if params.get("target"):
            qs = qs.filter(target=params["target"])
        return Response({"operations": [selectors.memory_operation_data(op) for op in qs[: params["limit"]]]})


# --- task state (B3) and session profile (B2b) ------------------------------------------------------------


def _state_data(overlay: Any) -> dict[str, Any]:
    return {
        "epoch": overlay.epoch,
        "base_epoch": overlay.base_epoch,
        "state": overlay.state,
        "base": overlay.base,
        "pending_events": [_event_data(e) for e in overlay.pending],
    }


def _event_data(event: Any) -> dict[str, Any]:
    return {
        "id": event.pk,
        "epoch": event.epoch,
        "event_type": event.event_type,
        "payload": event.payload,
        "request_id": event.request_id,
        "created_at": event.created_at,
    }


def _event_shape(event_type: str, *, path_required: bool, object_value: bool = False) -> dict[str, Any]:
    """One event type's body: a path of dot-separated keys (at least one, where one is needed) and, for
    merge, an object value (set and append take any value; a missing one is null)."""
    path = {"type": "string", "pattern": r"[^.]"} if path_required else {"type": "string"}
    payload: dict[str, Any] = {"type": "object", "properties": {"path": path}, "required": []}
    if path_required:
        payload["required"].append("path")
    if object_value:
        payload["properties"]["value"] = {"type": "object"}
        payload["required"].append("value")
    # A pattern, not an enum: drf-spectacular would make every enum here a component of its own.
    kind = {"type": "string", "pattern": f"^{event_type}$"}
    return {"properties": {"event_type": kind, "payload": payload}, "required": ["payload"]}


STATE_EVENT_SHAPES = [
    _event_shape(StateEvent.Type.SET, path_required=True),
    _event_shape(StateEvent.Type.MERGE, path_required=False, object_value=True),
    _event_shape(StateEvent.Type.DELETE, path_required=True),
    _event_shape(StateEvent.Type.APPEND, path_required=True),
]


class TaskStateApi(APIView):
    @extend_schema(
        responses={200: out.TaskStateOutputSerializer, **error_responses()},
        description="The task state as the model sees it: the base (folded up to `base_epoch`) with the "
        "newer events applied in epoch order (the overlay). `session_profile` is the session profile (B2b).",
    )
    def get(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        return Response(_state_data(state.state_overlay(conversation=conversation)))


class MemoryAgentProgressApi(APIView):
    @extend_schema(
        responses={200: out.MemoryAgentProgressOutputSerializer, **error_responses()},
        description="How far the memory agent (which runs in the background after each completed exchange) "
        "has read the conversation. A client that imported history waits until `pending` is false, as it "
        "waits for `retrieval_index` on the conversation.",
    )
    def get(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        return Response(selectors.memory_agent_progress(conversation=conversation))


class StateEventCreateApi(APIView):
    class StateEventInputSerializer(StrictSerializer):
        expected_epoch = serializers.IntegerField(min_value=0, max_value=INT32_MAX)
        request_id = serializers.CharField(max_length=200)
        event_type = serializers.ChoiceField(choices=StateEvent.Type.values)
        payload = serializers.DictField(required=False, default=dict)

        # What state.event_apply takes, by event type (config/schema.py).
        openapi_request_extra = {"oneOf": STATE_EVENT_SHAPES}

    @extend_schema(
        request=StateEventInputSerializer,
        responses={
            200: out.StateEventCreateOutputSerializer,
            201: out.StateEventCreateOutputSerializer,
            **error_responses({409: OpenApiResponse(description="epoch_moved: read the state again")}),
        },
        description="Append a task-state event at the epoch you read: `set` {path, value}, `merge` {path?, "
        "value: object}, `delete` {path}, `append` {path, value}. Paths are dot-separated keys. Durable on "
        "write; each accepted event advances the epoch by one, so a second writer at the same epoch gets "
        "409. A repeated request_id returns the original event (200).",
    )
    def post(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        data = validated(self.StateEventInputSerializer, request.data)
        event, created = state.state_event_append(conversation=conversation, **data)
        body = {"event": _event_data(event), **_state_data(state.state_overlay(conversation=conversation))}
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class StateFoldApi(APIView):
    @extend_schema(
        request=None,
        responses={200: out.StateFoldOutputSerializer, **error_responses()},
        description="Fold the pending events into the base now. The epoch stays (the state is the same).",
    )
    def post(self, request: Any, conversation_id: str) -> Response:
        conversation = access_conversation(tenant=request.auth.tenant, conversation_id=conversation_id)
        folded = state.state_fold(conversation=conversation)
        return Response({"folded": folded, **_state_data(state.state_overlay(conversation=conversation))})


# --- archival memory --------------------------------------------------------------------------------------


class ArchivalMemoryListCreateApi(APIView):
    class ArchivalMemoryInputSerializer(StrictSerializer):
        content = serializers.CharField(max_length=20_000)
        kind = serializers.ChoiceField(choices=ArchivalMemory.Kind.choices, default=ArchivalMemory.Kind.FACT)
        importance = serializers.FloatField(min_value=0, max_value=1, default=0.5)
        subject = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")
        conversation_id = serializers.UUIDField(required=False)
        source_message_ids = serializers.ListField(
            child=serializers.CharField(max_length=64), required=False, max_length=200, default=list
        )
        reason = serializers.CharField(required=False, allow_blank=True, max_length=1000, default="")

    class ArchivalMemoryFilterSerializer(StrictSerializer):
        include_invalidated = serializers.BooleanField(required=False, default=False)
        limit = serializers.IntegerField(required=False, min_value=1, max_value=500, default=100)

    @extend_schema(
        operation_id="users_memories_list",
        parameters=[ArchivalMemoryFilterSerializer],
        responses={200: out.ArchivalMemoryListOutputSerializer, **error_responses()},
    )
    def get(self, request: Any, external_id: str) -> Response:
        end_user = access_end_user(tenant=request.auth.tenant, external_id=external_id)
        params = validated(self.ArchivalMemoryFilterSerializer, request.query_params.dict())
        qs = ArchivalMemory.objects.filter(end_user=end_user)
        if not params["include_invalidated"]:
            qs = qs.filter(invalidated_at__isnull=True)
        return Response({"memories": [archival.memory_data(m) for m in qs[: params["limit"]]]})

    @extend_schema(
        request=ArchivalMemoryInputSerializer,
        responses={
            200: out.ArchivalInsertOutputSerializer,
            201: out.ArchivalInsertOutputSerializer,
            **error_responses(),
        },
        description="Store a fact or episode. A near-duplicate of a live memory is merged into it (200, "
        "action=merged); a fact about the same subject ('my X is …', or `subject`) invalidates the older one "
        "(kept, marked, excluded from search).",
    )
    def post(self, request: Any, external_id: str) -> Response:
        data = validated(self.ArchivalMemoryInputSerializer, request.data)
        tenant = request.auth.tenant
        conversation = None
        if data.get("conversation_id"):
            conversation = access_conversation(tenant=tenant, conversation_id=data["conversation_id"])
        with transaction.atomic():
            end_user = end_user_get_or_create(tenant=tenant, external_id=external_id)
            outcome = archival.archival_insert(
                end_user=end_user,
                content=data["content"],
                kind=data["kind"],
                importance=data["importance"],
                subject=data["subject"],
                conversation=conversation,
                source_message_ids=data["source_message_ids"],
                actor=Actor.API,
                actor_name=f"api_key:{request.auth.name}",
                trigger=data["reason"],
            )
        body = {
            "action": outcome.action,
            "memory": archival.memory_data(outcome.memory),
            "invalidated": [str(m.id) for m in outcome.invalidated],
            "degradations": outcome.degradations,
        }
        return Response(body, status=status.HTTP_201_CREATED if outcome.action == "inserted" else 200)


class ArchivalMemoryDetailApi(APIView):
    @extend_schema(responses={200: out.ArchivalMemoryOutputSerializer, **error_responses()})
    def get(self, request: Any, external_id: str, memory_id: str) -> Response:
        end_user = access_end_user(tenant=request.auth.tenant, external_id=external_id)
        memory = access_object(ArchivalMemory.objects.all(), pk=memory_id, end_user=end_user)
        return Response(archival.memory_data(memory))

    @extend_schema(responses={204: None, **error_responses()}, description="Delete a memory (logged).")
    def delete(self, request: Any, external_id: str, memory_id: str) -> Response:
        end_user = access_end_user(tenant=request.auth.tenant, external_id=external_id)
        memory = access_object(ArchivalMemory.objects.all(), pk=memory_id, end_user=end_user)
        archival.archival_delete(memory=memory, actor=Actor.API, actor_name=f"api_key:{request.auth.name}")
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- the end user's data ----------------------------------------------------------------------------------


class EndUserExportApi(APIView):
    @extend_schema(
        responses={200: out.EndUserExportOutputSerializer, **error_responses()},
        description="Everything Mnemo holds about the end user: core memory with its history, archival "
        "memories (invalidated ones too), the memory-operation log, and their conversations with messages "
        "and "
        "task state.",
    )
    def get(self, request: Any, external_id: str) -> Response:
        end_user = access_end_user(tenant=request.auth.tenant, external_id=external_id)
        response = Response(enduser.end_user_export(end_user=end_user))
        response["Content-Disposition"] = 'attachment; filename="export.json"'
        return response


class EndUserDetailApi(APIView):
    @extend_schema(
        responses={200: out.EndUserDeleteOutputSerializer, **error_responses()},
        description="Delete the end user and all their data: memory, conversations, transcripts and images.",
    )
    def delete(self, request: Any, external_id: str) -> Response:
        end_user = access_end_user(tenant=request.auth.tenant, external_id=external_id)
        return Response({"deleted": enduser.end_user_delete(end_user=end_user)})
