"""REST endpoints for documents (knowledge search is retrieval's: retrieval.apis). Views validate, call one
service or selector and render; every document is fetched through the caller's tenant."""

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import ErrorDetail, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.apis import ConversationCursorPagination
from knowledge import services
from knowledge.models import Document
from knowledge.selectors import access_document, chunk_list, document_list
from knowledge.serializers import ChunkOutputSerializer, DocumentOutputSerializer
from tenants.api import (
    ERROR_SCHEMA,
    LimitedMultiPartParser,
    StrictSerializer,
    cursor_page,
    error_responses,
    validated,
)
from tenants.models import EXTERNAL_ID_MAX_LENGTH

_TOO_LARGE = {413: OpenApiResponse(ERROR_SCHEMA, description="A file or the request is over the size limit")}
_END_USER = EXTERNAL_ID_MAX_LENGTH


class DocumentListCreateApi(APIView):
    parser_classes = [LimitedMultiPartParser]

    class UploadSerializer(StrictSerializer):
        conversation = serializers.UUIDField(required=False)
        end_user = serializers.CharField(max_length=_END_USER, required=False)

    class FilterSerializer(serializers.Serializer):
        conversation = serializers.UUIDField(required=False, help_text="Only documents of this conversation")
        end_user = serializers.CharField(
            max_length=_END_USER, required=False, help_text="Only documents of this end user (external id)"
        )
        scope = serializers.ChoiceField(choices=Document.Scope.choices, required=False)
        status = serializers.ChoiceField(choices=Document.Status.choices, required=False)
        kind = serializers.ChoiceField(choices=Document.Kind.choices, required=False)
        limit = serializers.IntegerField(
            min_value=1, required=False, help_text="Page size (default 50; above 200 counts as 200)"
        )
        cursor = serializers.CharField(required=False, help_text="Cursor from the previous page's next link")

    @extend_schema(
        operation_id="documents_list",
        parameters=[FilterSerializer],
        responses={200: cursor_page("DocumentPage", DocumentOutputSerializer), **error_responses()},
    )
    def get(self, request: Any) -> Response:
        # A plain dict: from a QueryDict, DRF reads an empty value (limit=) as absent.
        filters = validated(self.FilterSerializer, request.query_params.dict())
        filters.pop("cursor", None)
        filters.pop("limit", None)
        qs = document_list(
            tenant=request.auth.tenant,
            conversation_id=filters.pop("conversation", None),
            **filters,
        )
        paginator = ConversationCursorPagination()
        page = paginator.paginate_queryset(qs, request, view=self)
        return paginator.get_paginated_response(DocumentOutputSerializer(page, many=True).data)

    @extend_schema(
        request={
            "multipart/form-data": inline_serializer(
                "DocumentUpload",
                {
                    "file": serializers.ListField(child=serializers.FileField()),
                    "conversation": serializers.UUIDField(required=False),
                    "end_user": serializers.CharField(required=False),
                },
            )
        },
        responses={
            201: inline_serializer("DocumentBatch", {"documents": DocumentOutputSerializer(many=True)}),
            **error_responses(_TOO_LARGE),
        },
        description="Upload one or more files (the field `file`, repeated) as documents of the tenant, an "
        "end user or a conversation. Each is processed in the background (`status` pending → ready | "
        "failed); a file already in that scope (same sha256) answers with its document.",
    )
    def post(self, request: Any) -> Response:
        unknown = sorted(set(request.FILES) - {"file"})
        if unknown:
            raise ValidationError({k: [ErrorDetail("Unknown field.", code="unknown_field")] for k in unknown})
        form = {key: request.data.get(key) for key in request.data if key not in request.FILES}
        data = validated(self.UploadSerializer, form)
        scope = services.scope_resolve(
            tenant=request.auth.tenant,
            conversation_id=data.get("conversation"),
            end_user=data.get("end_user"),
        )
        uploaded = services.documents_upload(
            tenant=request.auth.tenant, files=request.FILES.getlist("file"), scope=scope
        )
        documents = DocumentOutputSerializer([u.document for u in uploaded], many=True).data
        for row, upload in zip(documents, uploaded, strict=True):
            row["duplicate"] = not upload.created
        return Response({"documents": documents}, status=status.HTTP_201_CREATED)


class DocumentDetailApi(APIView):
    @extend_schema(responses={200: DocumentOutputSerializer, **error_responses()})
    def get(self, request: Any, document_id: str) -> Response:
        document = access_document(tenant=request.auth.tenant, document_id=document_id)
        return Response(DocumentOutputSerializer(document).data)

    @extend_schema(responses={204: None, **error_responses()})
    def delete(self, request: Any, document_id: str) -> Response:
        document = access_document(tenant=request.auth.tenant, document_id=document_id)
        services.document_delete(document=document)
        return Response(status=status.HTTP_204_NO_CONTENT)


class DocumentChunksApi(APIView):
    class FilterSerializer(serializers.Serializer):
        after = serializers.IntegerField(min_value=-1, max_value=2**31, required=False, default=-1)
        limit = serializers.IntegerField(min_value=1, max_value=500, required=False, default=100)

    @extend_schema(
        parameters=[
            OpenApiParameter("after", int, description="Chunks with an ordinal greater than this"),
            OpenApiParameter("limit", int, description="At most this many (≤ 500)"),
        ],
        responses={
            200: inline_serializer("ChunkPage", {"chunks": ChunkOutputSerializer(many=True)}),
            **error_responses(),
        },
    )
    def get(self, request: Any, document_id: str) -> Response:
        document = access_document(tenant=request.auth.tenant, document_id=document_id)
        filters = validated(self.FilterSerializer, request.query_params)
        chunks = chunk_list(document=document, after=filters["after"], limit=filters["limit"])
        return Response(
            {"document": str(document.pk), "chunks": ChunkOutputSerializer(chunks, many=True).data}
        )
