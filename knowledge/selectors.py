"""Reads of documents and chunks, always inside one tenant."""

from typing import Any

from django.db.models import QuerySet

from knowledge.models import Chunk, Document
from tenants.models import Tenant
from tenants.scoping import access_object


def access_document(*, tenant: Tenant, document_id: object) -> Document:
    """The tenant's document, else Http404 (also for a malformed id)."""
    return access_object(Document.objects.select_related("end_user"), pk=document_id, tenant=tenant)


def document_list(
    *,
    tenant: Tenant,
    conversation_id: Any = None,
    end_user: str | None = None,
    scope: str | None = None,
    status: str | None = None,
    kind: str | None = None,
) -> QuerySet[Document]:
    qs = Document.objects.filter(tenant=tenant).select_related("end_user")
    if conversation_id is not None:
        qs = qs.filter(conversation_id=conversation_id)
    if end_user is not None:
        qs = qs.filter(end_user__external_id=end_user)
    if scope is not None:
        qs = qs.filter(scope=scope)
    if status is not None:
        qs = qs.filter(status=status)
    if kind is not None:
        qs = qs.filter(kind=kind)
    return qs


def chunk_list(*, document: Document, after: int = -1, limit: int = 100) -> list[Chunk]:
    """The document's chunks after ordinal `after`, in order."""
    return list(
        Chunk.objects.filter(document=document, ordinal__gt=after)
        .defer("embedding")
        .order_by("ordinal")[:limit]
    )
