"""Images in the admin, scoped to the user's tenants: thumbnails, tier and role, filters by conversation and
tier, and pinning. Image rows are written by intake and compaction only, so nothing here adds or deletes."""

from typing import Any

from django.contrib import admin, messages
from django.core.cache import cache
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils.html import format_html

from cold_storage.imaging import thumbnail_png
from cold_storage.models import ArchivedImage
from cold_storage.selectors import ImageBytesUnavailable, image_bytes
from cold_storage.services import image_pin
from tenants.admin_scoping import AppendOnlyAdmin

THUMBNAIL_URL_NAME = "admin:cold_storage_archivedimage_thumbnail"


def thumbnail_tag(image_id: str, *, size: int = 96, title: str = "") -> str:
    """An <img> of the image's thumbnail (served by the admin below, so tenant-checked)."""
    url = reverse(THUMBNAIL_URL_NAME, args=[image_id])
    return format_html(
        '<img src="{}" alt="{}" title="{}" loading="lazy" style="max-width:{}px;max-height:{}px;'
        'border:1px solid #ccc;vertical-align:middle">',
        url,
        image_id,
        title or image_id,
        size,
        size,
    )


class ConversationFilter(admin.SimpleListFilter):
    title = "conversation"
    parameter_name = "conversation_id"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = (
            model_admin.get_queryset(request)
            .order_by("-created_at")
            .values_list("conversation_id", flat=True)
            .distinct()[:500]
        )
        seen: list[str] = []
        for conversation_id in recent:
            if str(conversation_id) not in seen:
                seen.append(str(conversation_id))
            if len(seen) == 20:
                break
        return [(value, value[:8] + "…") for value in seen]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        try:
            return queryset.filter(conversation_id=value)
        except Exception:  # a malformed UUID in the query string
            return queryset.none()


# The change page's fields, all read-only but pinning (a tuple: the admin's fields and readonly_fields are
# typed apart, and only a tuple of names fits both).
_IMAGE_FIELDS = (
    "preview",
    "id",
    "tenant",
    "conversation",
    "turn_id",
    "message_id",
    "role",
    "tier",
    "pinned",
    "dimensions",
    "format",
    "media_type",
    "size",
    "sha256",
    "phash",
    "dhash",
    "ahash",
    "duplicate_of",
    "hamming_distance",
    "storage_key",
    "compacted_at",
    "purged_at",
    "created_at",
    "last_accessed_at",
)


@admin.register(ArchivedImage)
class ArchivedImageAdmin(AppendOnlyAdmin):
    list_display = [
        "thumbnail",
        "id",
        "conversation",
        "role",
        "tier",
        "dimensions",
        "size",
        "duplicate_of",
        "pinned",
        "compacted_at",
        "purged_at",
        "created_at",
    ]
    list_filter = [ConversationFilter, "tier", "role", "pinned", ("purged_at", admin.EmptyFieldListFilter)]
    list_select_related = ["tenant"]
    search_fields = ["=id", "=conversation_id", "=message_id", "=sha256"]
    ordering = ["-created_at"]
    actions = ["pin", "unpin"]
    fields = _IMAGE_FIELDS
    readonly_fields = [f for f in _IMAGE_FIELDS if f != "pinned"]

    # No add and no delete (AppendOnlyAdmin): images go with their conversation (or their bytes with
    # retention); a lone row delete would leave a part naming nothing.

    @admin.display(description="Image")
    def thumbnail(self, obj: ArchivedImage) -> str:
        return thumbnail_tag(obj.id, size=64)

    @admin.display(description="Image")
    def preview(self, obj: ArchivedImage) -> str:
        return thumbnail_tag(obj.id, size=320)

    @admin.display(description="Size (px)")
    def dimensions(self, obj: ArchivedImage) -> str:
        return f"{obj.width}×{obj.height}"

    @admin.display(description="Conversation")
    def conversation(self, obj: ArchivedImage) -> str:
        url = reverse("admin:conversations_conversation_change", args=[obj.conversation_id])
        return format_html('<a href="{}">{}</a>', url, str(obj.conversation_id)[:8] + "…")

    @admin.action(description="Pin (retention keeps their bytes)", permissions=["change"])
    def pin(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._set_pinned(request, queryset, True)

    @admin.action(description="Unpin", permissions=["change"])
    def unpin(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._set_pinned(request, queryset, False)

    def _set_pinned(self, request: HttpRequest, queryset: QuerySet, pinned: bool) -> None:
        count = 0
        for image in queryset:
            if self.has_change_permission(request, image):
                image_pin(image=image, pinned=pinned)
                count += 1
        self.message_user(
            request, f"{'Pinned' if pinned else 'Unpinned'} {count} image(s).", messages.SUCCESS
        )

    def get_urls(self) -> list[Any]:
        return [
            path(
                "<str:image_id>/thumbnail/",
                self.admin_site.admin_view(self.thumbnail_view),
                name="cold_storage_archivedimage_thumbnail",
            ),
            *super().get_urls(),
        ]

    def thumbnail_view(self, request: HttpRequest, image_id: str) -> HttpResponse:
        image = self.get_queryset(request).select_related("duplicate_of").filter(pk=image_id).first()
        if image is None or not self.has_view_permission(request, image):
            raise Http404
        source = image.duplicate_of or image
        key = f"mnemo:thumb:{source.sha256}"
        png = cache.get(key)
        if png is None:
            try:
                png = thumbnail_png(image_bytes(image))
            except ImageBytesUnavailable:
                raise Http404 from None
            cache.set(key, png, timeout=24 * 3600)
        response = HttpResponse(png, content_type="image/png")
        response["Cache-Control"] = "private, max-age=3600"
        return response
