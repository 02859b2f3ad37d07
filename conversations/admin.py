import uuid
from typing import Any, TypeGuard

from django import forms
from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator
from rest_framework.exceptions import ValidationError

from cold_storage.admin import thumbnail_tag
from conversations.models import Conversation, Message, Turn
from conversations.parts import image_line, iter_image_parts, parts_text, parts_validate
from conversations.services import message_name_check, message_token_count
from tenants.admin_scoping import AppendOnlyAdmin, TenantScopedAdmin, member_tenant_ids


class TurnInline(admin.TabularInline):
    model = Turn
    extra = 0
    readonly_fields = ("index", "status", "started_at", "ended_at")
    fields = readonly_fields  # all shown, none editable
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def conversation_label(conversation: Conversation) -> str:
    """How a conversation is told apart in lists, filters and pickers: its end user, short id,
    creation time and message count, then its title."""
    end_user = conversation.end_user.external_id if conversation.end_user else "no end user"
    created = timezone.localtime(conversation.created_at).strftime("%Y-%m-%d %H:%M")
    title = f" · {Truncator(conversation.title).chars(40)}" if conversation.title else ""
    count = conversation.last_seq
    return f"{end_user} · {str(conversation.pk)[:8]} · {created} · {count} message{'s' * (count != 1)}{title}"


class ConversationFilter(admin.SimpleListFilter):
    """ "By conversation" on lists of a conversation's rows: the user's 30 newest, and the chosen one. The
    parameter is the one Django's own lookup would use, so links like ?conversation__id__exact= work."""

    title = "conversation"
    parameter_name = "conversation__id__exact"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        visible = Conversation.objects.select_related("end_user")
        if not request.user.is_superuser:
            visible = visible.filter(tenant__in=member_tenant_ids(request, model_admin.view_roles))
        value = self.value()
        chosen = list(visible.filter(pk=value)) if self._valid(value) else []
        newest = [c for c in visible.order_by("-created_at")[:30] if c not in chosen]
        return [(str(c.pk), conversation_label(c)) for c in [*chosen, *newest]]

    @staticmethod
    def _valid(value: str | None) -> TypeGuard[str]:
        try:
            return value is not None and bool(uuid.UUID(value))
        except ValueError:
            return False

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() is None:
            return queryset
        return queryset.filter(conversation_id=self.value()) if self._valid(self.value()) else queryset.none()


@admin.register(Conversation)
class ConversationAdmin(TenantScopedAdmin):
    list_display = [
        "__str__",
        "short_id",
        "tenant",
        "end_user",
        "message_count",
        "model",
        "created_at",
        "archived_at",
    ]
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
    transcript_page_size = 50

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        conversation = self.get_object(request, object_id)
        if conversation is not None:
            page = request.GET.get("transcript_page", "1")
            extra_context = {**(extra_context or {}), "transcript": self._transcript(conversation, page)}
        return super().change_view(request, object_id, form_url, extra_context)

    def _transcript(self, conversation: Conversation, number: str) -> dict[str, Any]:
        """One page of the conversation as it reads: roles, text, image thumbnails, partial
        and error replies marked, compaction boundaries as rules and summaries as such."""
        messages = Message.objects.filter(conversation=conversation).order_by("seq")
        paginator = Paginator(messages, self.transcript_page_size)
        page = paginator.get_page(number)
        return {
            "messages": [transcript_entry(m) for m in page.object_list],
            "page": page.number,
            "pages": paginator.num_pages,
            "page_range": paginator.get_elided_page_range(page.number, on_each_side=2, on_ends=1),
            "count": paginator.count,
            "start": page.start_index(),
            "end": page.end_index(),
        }

    @admin.display(description="id", ordering="id")
    def short_id(self, obj: Conversation) -> str:
        return str(obj.pk)[:8]

    @admin.display(description="messages", ordering="last_seq")
    def message_count(self, obj: Conversation) -> int:
        return obj.last_seq

    @admin.display(description="Messages")
    def transcript(self, obj: Conversation) -> str:
        url = reverse("admin:conversations_message_changelist") + f"?conversation__id__exact={obj.pk}"
        return format_html(
            '<a href="#transcript">Transcript below</a> · <a href="{}">{} messages in the list</a>',
            url,
            obj.last_seq,
        )


def message_thumbnails(message: Message, *, size: int, limit: int) -> str:
    tags = []
    for part in list(iter_image_parts(message.parts or []))[:limit]:
        if "image_id" not in part:
            continue
        # A placeholder or a duplicate says so in its title; the thumbnail still shows the pixels.
        title = image_line(part) or f"{part['image_id']} (pixels kept)"
        tags.append(thumbnail_tag(part["image_id"], size=size, title=title))
    return format_html_join(" ", "{}", ((t,) for t in tags)) if tags else ""


def transcript_entry(message: Message) -> dict[str, Any]:
    return {
        "seq": message.seq,
        "role": message.role,
        "boundary": message.kind == Message.Kind.COMPACT_BOUNDARY,
        "summary": message.kind == Message.Kind.COMPACT_SUMMARY,
        "partial": not message.completed,
        "error": message.is_error,
        "created_at": message.created_at,
        "tokens": message.token_count,
        "text": message.content or parts_text(message.parts or []),
        "images": message_thumbnails(message, size=160, limit=20),
        "url": reverse("admin:conversations_message_change", args=[message.pk]),
    }


class MessageAdminForm(forms.ModelForm):
    class Meta:
        model = Message
        fields = ["name", "content", "parts", "completed", "is_error", "metadata"]

    def clean_name(self) -> str:
        try:
            return message_name_check(self.cleaned_data.get("name"))
        except ValueError as exc:
            raise forms.ValidationError(f"The name {exc}") from None

    def clean_parts(self) -> Any:
        try:
            return parts_validate(self.cleaned_data["parts"])
        except ValidationError as exc:
            raise forms.ValidationError(error_sentences(exc.detail)) from None


def error_sentences(detail: Any, path: tuple[str, ...] = ()) -> list[str]:
    """DRF's nested error detail as sentences a person reads: "Part 1: Unknown part type…"
    instead of {'parts': {'0': [ErrorDetail(string=…)]}}."""
    if isinstance(detail, dict):
        return [s for key, value in detail.items() for s in error_sentences(value, (*path, str(key)))]
    if isinstance(detail, list):
        return [s for item in detail for s in error_sentences(item, path)]
    where = [f"part {int(step) + 1}" if step.isdigit() else step for step in path if step != "parts"]
    message = str(detail)
    return [f"{' '.join(where).capitalize()}: {message}" if where else message]


@admin.register(Message)
class MessageAdmin(AppendOnlyAdmin):
    # Messages arrive through the API; an operator may correct one's content (recounted below).
    form = MessageAdminForm
    tenant_lookup = "conversation__tenant"
    # Narrow columns, so the content has the room at 1,400 px: role and kind in one, the
    # flags as one state.
    list_display = ["seq", "conversation_short", "role_kind", "preview", "tokens", "state"]
    list_filter = [ConversationFilter, "role", "kind", "completed", "is_error"]
    list_select_related = ["conversation__end_user"]
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
        "name",
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

    @admin.display(description="Conversation", ordering="conversation")
    def conversation_short(self, obj: Message) -> str:
        conversation = obj.conversation
        end_user = conversation.end_user.external_id if conversation.end_user else "—"
        return f"{end_user} · {str(conversation.pk)[:8]}"

    @admin.display(description="Role", ordering="role")
    def role_kind(self, obj: Message) -> str:
        marks: dict[str, str] = {
            Message.Kind.COMPACT_BOUNDARY: "boundary",
            Message.Kind.COMPACT_SUMMARY: "summary",
        }
        return f"{obj.role} ({marks[obj.kind]})" if obj.kind in marks else obj.role

    @admin.display(description="Content")
    def preview(self, obj: Message) -> str:
        text = Truncator(obj.content or parts_text(obj.parts or [])).chars(200)
        images = self._thumbnails(obj, size=48, limit=4)
        return format_html("{}<br>{}", text, images) if images != "—" else text

    @admin.display(description="Tokens", ordering="token_count")
    def tokens(self, obj: Message) -> int:
        return obj.token_count

    @admin.display(description="State")
    def state(self, obj: Message) -> str:
        flags = [name for name, on in (("partial", not obj.completed), ("error", obj.is_error)) if on]
        return ", ".join(flags) or "✓"

    def _thumbnails(self, obj: Message, size: int, limit: int) -> str:
        return message_thumbnails(obj, size=size, limit=limit) or "—"

    @admin.display(description="Images")
    def images(self, obj: Message) -> str:
        return self._thumbnails(obj, size=240, limit=50)

    def save_model(self, request: HttpRequest, obj: Message, form: Any, change: bool) -> None:
        # An operator's correction is counted like any write, so the context budget stays exact.
        obj.token_count = message_token_count(
            role=obj.role,
            content=obj.content,
            parts=obj.parts,
            tenant_id=obj.conversation.tenant_id,
            model=obj.conversation.model,
            name=obj.name,
        )
        super().save_model(request, obj, form, change)
