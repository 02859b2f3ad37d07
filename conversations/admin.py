from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator
from rest_framework.exceptions import ValidationError

from cold_storage.admin import thumbnail_tag
from conversations.models import Conversation, Message, Turn
from conversations.parts import image_line, iter_image_parts, parts_validate
from conversations.services import message_token_count
from tenants.admin_scoping import AppendOnlyAdmin, TenantScopedAdmin


class TurnInline(admin.TabularInline):
    model = Turn
    extra = 0
    fields = ["index", "status", "started_at", "ended_at"]
    readonly_fields = fields
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Conversation)
class ConversationAdmin(TenantScopedAdmin):
    list_display = ["__str__", "tenant", "end_user", "model", "last_seq", "created_at", "archived_at"]
    list_filter = ["tenant", "model", ("archived_at", admin.EmptyFieldListFilter)]
    list_select_related = ["tenant", "end_user"]
    search_fields = ["id", "title", "end_user__external_id"]
    readonly_fields = [
        "id",
        "tenant",
        "end_user",
        "last_seq",
        "last_turn_index",
        "created_at",
        "updated_at",
        "transcript",
    ]
    fields = [
        "id",
        "tenant",
        "end_user",
        "title",
        "model",
        "metadata",
        "archived_at",
        "last_seq",
        "last_turn_index",
        "created_at",
        "updated_at",
        "transcript",
    ]
    inlines = [TurnInline]
    delete_roles = TenantScopedAdmin.change_roles

    @admin.display(description="Messages")
    def transcript(self, obj: Conversation) -> str:
        url = reverse("admin:conversations_message_changelist") + f"?conversation__id__exact={obj.pk}"
        return format_html('<a href="{}">{} messages</a>', url, obj.last_seq)


class MessageAdminForm(forms.ModelForm):
    class Meta:
        model = Message
        fields = ["content", "parts", "completed", "is_error", "metadata"]

    def clean_parts(self) -> Any:
        try:
            return parts_validate(self.cleaned_data["parts"])
        except ValidationError as exc:
            raise forms.ValidationError(str(exc.detail)) from None


@admin.register(Message)
class MessageAdmin(AppendOnlyAdmin):
    # Messages arrive through the API; an operator may correct one's content (recounted below).
    form = MessageAdminForm
    tenant_lookup = "conversation__tenant"
    list_display = [
        "seq",
        "conversation",
        "role",
        "kind",
        "preview",
        "thumbnails",
        "token_count",
        "completed",
        "is_error",
        "created_at",
    ]
    list_filter = ["role", "kind", "completed", "is_error"]
    list_select_related = ["conversation"]
    search_fields = ["content", "=conversation__id"]
    ordering = ["conversation", "seq"]
    readonly_fields = [
        "id",
        "conversation",
        "seq",
        "turn",
        "role",
        "kind",
        "token_count",
        "idempotency_key",
        "parent",
        "created_at",
        "images",
    ]
    fields = [
        "id",
        "conversation",
        "seq",
        "turn",
        "role",
        "kind",
        "content",
        "parts",
        "images",
        "completed",
        "is_error",
        "metadata",
        "token_count",
        "idempotency_key",
        "parent",
        "created_at",
    ]

    @admin.display(description="Content")
    def preview(self, obj: Message) -> str:
        return Truncator(obj.content).chars(80)

    def _thumbnails(self, obj: Message, size: int, limit: int) -> str:
        tags = []
        for part in list(iter_image_parts(obj.parts))[:limit]:
            if "image_id" not in part:
                continue
            # A placeholder or a duplicate says so in its title; the thumbnail still shows the pixels.
            title = image_line(part) or f"{part['image_id']} (pixels kept)"
            tags.append(thumbnail_tag(part["image_id"], size=size, title=title))
        return format_html_join(" ", "{}", ((t,) for t in tags)) if tags else "—"

    @admin.display(description="Images")
    def thumbnails(self, obj: Message) -> str:
        return self._thumbnails(obj, size=48, limit=4)

    @admin.display(description="Images")
    def images(self, obj: Message) -> str:
        return self._thumbnails(obj, size=240, limit=50)

    def save_model(self, request: HttpRequest, obj: Message, form: Any, change: bool) -> None:
        # An operator's correction is counted like any write, so the context budget stays exact.
        obj.token_count = message_token_count(
            role=obj.role, content=obj.content, parts=obj.parts, model=obj.conversation.model
        )
        super().save_model(request, obj, form, change)
