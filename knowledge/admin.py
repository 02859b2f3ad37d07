"""Admin for support staff and operators: documents with their scope, status, size and chunk count; a
read-only chunk viewer with provenance; delete (operators), which takes the chunks, their vectors and, on
commit, the bytes (knowledge.receivers); the image descriptions a vision model wrote, read-only."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.text import Truncator

from knowledge.models import Chunk, Document, ImageDescription
from tenants.admin_scoping import AppendOnlyAdmin, TenantScopedAdmin
from tenants.models import Membership


class ChunkInline(admin.TabularInline):
    model = Chunk
    readonly_fields = ("ordinal", "provenance", "token_count", "excerpt")
    fields = readonly_fields  # all shown, none editable
    ordering = ["ordinal"]
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may view the document may read its chunks (Django would ask for model permissions).
        return self.admin_site._registry[Document].has_view_permission(request, obj)

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).defer("embedding")

    @admin.display(description="Where")
    def provenance(self, chunk: Chunk) -> str:
        return provenance(chunk)

    @admin.display(description="Text")
    def excerpt(self, chunk: Chunk) -> str:
        return Truncator(chunk.content).chars(200)


def provenance(chunk: Chunk) -> str:
    parts = []
    if chunk.path:
        parts.append(chunk.path)
    if chunk.start_line:
        parts.append(f"lines {chunk.start_line}-{chunk.end_line}")
    if chunk.symbol:
        parts.append(chunk.symbol)
    if chunk.page:
        parts.append(f"page {chunk.page}")
    if chunk.sheet:
        parts.append(f"{chunk.sheet}!{chunk.cell_range}")
    if chunk.heading:
        parts.append(chunk.heading)
    return " · ".join(parts)


@admin.register(Document)
class DocumentAdmin(TenantScopedAdmin):
    list_display = [
        "name", "tenant", "scope", "owner", "kind", "format", "status", "size", "chunk_count", "created_at",
    ]  # fmt: skip
    list_filter = ["status", "kind", "scope", "format"]
    list_select_related = ["tenant", "end_user"]
    search_fields = ["name", "=sha256", "=id"]
    ordering = ["-created_at"]
    readonly_fields = (
        "id", "tenant", "scope", "end_user", "conversation", "name", "kind", "format", "status", "error_code",
        "error", "size", "sha256", "storage_key", "chunk_count", "token_count", "details", "created_at",
        "processed_at",
    )  # fmt: skip
    fields = readonly_fields  # all shown, none editable
    inlines = [ChunkInline]
    delete_roles = (Membership.Role.OPERATOR,)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False  # documents arrive through the API, which processes them

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="End user / conversation")
    def owner(self, document: Document) -> str:
        if document.conversation_id:
            return f"conversation {document.conversation_id}"
        return document.end_user.external_id if document.end_user else "—"


@admin.register(Chunk)
class ChunkAdmin(AppendOnlyAdmin):
    """The chunk viewer: read-only, reached from its document, deleted only with it."""

    list_display = ["__str__", "document", "where", "token_count"]
    list_select_related = ["document"]
    search_fields = ["=document__id", "symbol", "path"]
    readonly_fields = (
        "document", "ordinal", "kind", "language", "path", "symbol", "start_line", "end_line", "page",
        "heading", "sheet", "cell_range", "token_count", "embedding_model", "content",
    )  # fmt: skip
    fields = readonly_fields  # all shown, none editable

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).defer("embedding")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="Where")
    def where(self, chunk: Chunk) -> str:
        return provenance(chunk)


DESCRIPTION_FIELDS = ("tenant", "sha256", "model", "text", "prompt_tokens", "completion_tokens", "created_at")


@admin.register(ImageDescription)
class ImageDescriptionAdmin(AppendOnlyAdmin):
    """What the vision model said the image with these bytes shows (one per tenant and sha256): written by
    the background task, deleted with the tenant's last image of those bytes."""

    list_display = ["short_sha256", "excerpt", "model", "tenant", "created_at"]
    list_select_related = ["tenant"]
    search_fields = ["=sha256", "text"]
    ordering = ["-created_at"]
    fields = DESCRIPTION_FIELDS
    readonly_fields = DESCRIPTION_FIELDS

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="sha256")
    def short_sha256(self, row: ImageDescription) -> str:
        return row.sha256[:12]

    @admin.display(description="Description")
    def excerpt(self, row: ImageDescription) -> str:
        return Truncator(row.text).chars(120)
