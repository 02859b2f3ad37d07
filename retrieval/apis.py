"""The search endpoints: knowledge search and archival memory search. Thin views over retrieval's searches,
at the URLs they always had (retrieval.urls, included under /api/v1/)."""

from typing import Any, cast

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from knowledge import services
from knowledge.models import Document
from memory import serializers as out
from memory.archival import memory_data
from retrieval.archival import archival_search
from retrieval.knowledge import knowledge_search
from retrieval.serializers import hit_data
from tenants.api import LimitedJSONParser, StrictSerializer, error_responses, validated
from tenants.models import EndUser
from tenants.scoping import access_end_user

# A CharField always has its max_length.
_END_USER = cast(int, EndUser._meta.get_field("external_id").max_length)


class KnowledgeSearchApi(APIView):
    parser_classes = [LimitedJSONParser]

    class InputSerializer(StrictSerializer):
        query = serializers.CharField(max_length=4000)
        conversation = serializers.UUIDField(required=False)
        end_user = serializers.CharField(max_length=_END_USER, required=False)
        kinds = serializers.ListField(
            child=serializers.ChoiceField(choices=Document.Kind.choices), required=False, allow_empty=False
        )
        limit = serializers.IntegerField(min_value=1, max_value=100, required=False, default=10)

    @extend_schema(
        request=InputSerializer,
        responses={
            200: inline_serializer("KnowledgeResults", {"results": serializers.ListField()}),
            **error_responses(),
        },
        description="Chunks of documents and code in scope for a question (tenant-wide documents; with "
        "`end_user`, also theirs; with `conversation`, also its own and its end user's), ranked by BM25 over "
        "identifier-aware terms, symbol trigram similarity and embedding similarity, fused with RRF.",
    )
    def post(self, request: Any) -> Response:
        data = validated(self.InputSerializer, request.data)
        scope = services.scope_resolve(
            tenant=request.auth.tenant,
            conversation_id=data.get("conversation"),
            end_user=data.get("end_user"),
            create=False,
        )
        result = knowledge_search(
            tenant_id=request.auth.tenant.pk,
            query=data["query"],
            end_user_id=getattr(scope.end_user, "pk", None),
            conversation=scope.conversation,
            kinds=set(data["kinds"]) if data.get("kinds") else None,
            limit=data["limit"],
        )
        return Response({"results": [hit_data(h) for h in result.hits], "degradations": result.degradations})


class ArchivalMemorySearchApi(APIView):
    class ArchivalSearchFilterSerializer(StrictSerializer):
        q = serializers.CharField(max_length=2000)
        limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=10)

    @extend_schema(
        parameters=[ArchivalSearchFilterSerializer],
        responses={200: out.ArchivalSearchOutputSerializer, **error_responses()},
        description="Hybrid search over live memories: BM25 and exact vector rankings fused with reciprocal "
        "rank fusion (k = 60). Without embeddings it is lexical only, reported in `degradations`.",
    )
    def get(self, request: Any, external_id: str) -> Response:
        end_user = access_end_user(tenant=request.auth.tenant, external_id=external_id)
        params = validated(self.ArchivalSearchFilterSerializer, request.query_params.dict())
        outcome = archival_search(end_user=end_user, query=params["q"], limit=params["limit"])
        return Response(
            {
                "mode": outcome.mode,
                "results": [
                    {
                        "memory": memory_data(hit.memory),
                        "score": hit.score,
                        "lexical_rank": hit.lexical_rank,
                        "vector_rank": hit.vector_rank,
                    }
                    for hit in outcome.hits
                ],
                "degradations": outcome.degradations,
            }
        )
