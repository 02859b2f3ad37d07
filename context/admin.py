"""Admin: agent profiles and the context inspector (the assembled prompt for a conversation and a test
message, with per-block tokens, hashes, provenance and what the budget dropped)."""

import json
from typing import Any, cast

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path

from context.models import AgentProfile, ConversationContext
from context.pipeline import context_assemble
from context.serializers import context_payload
from context.services import agent_profile_create, agent_profile_update
from context.state import ContextRequest
from conversations.admin import conversation_label
from conversations.models import Conversation
from prefix_cache.rendering import FORMATS
from tenants.admin_scoping import TenantScopedAdmin, member_tenant_ids
from tenants.errors import ApplicationError


class InspectorForm(forms.Form):
    conversation = forms.ModelChoiceField(queryset=Conversation.objects.none())
    user_message = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), initial="What did we decide?")
    token_budget = forms.IntegerField(required=False, min_value=256)
    format = forms.ChoiceField(choices=[(f, f) for f in FORMATS], initial="openai")

    def __init__(self, *args: Any, conversations: Any, grouped: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = cast("forms.ModelChoiceField[Any]", self.fields["conversation"])
        field.queryset = conversations
        # Told apart by end user, short id, created and message count; under their tenant's name when the
        # user sees several tenants. The queryset still decides what is accepted.
        labelled = [(c, conversation_label(c)) for c in conversations[:200]]
        if grouped:
            groups: dict[str, list[tuple[str, str]]] = {}
            for conversation, label in labelled:
                groups.setdefault(conversation.tenant.name, []).append((str(conversation.pk), label))
            field.widget.choices = [("", "---------"), *groups.items()]
        else:
            field.widget.choices = [("", "---------"), *((str(c.pk), label) for c, label in labelled)]


# --- The inspector's prompt as people read it: text with its line breaks, images as thumbnails,
# anything else as indented JSON with long strings (base64) shortened.
LONG_STRING = 300


def _shortened(value: Any) -> Any:
    if isinstance(value, str) and len(value) > LONG_STRING:
        return f"{value[:80]}… ({len(value):,} characters)"
    if isinstance(value, dict):
        return {k: _shortened(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shortened(v) for v in value]
    return value


def _image_src(block: dict[str, Any]) -> str | None:
    """A data: URL for an image block of any of the formats (OpenAI image_url, Anthropic image source)."""
    if block.get("type") == "image_url":
        url = (block.get("image_url") or {}).get("url", "")
        return url if url.startswith("data:image/") else None
    source = block.get("source") or {}
    if block.get("type") == "image" and source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    return None


def readable_content(content: Any) -> list[dict[str, Any]]:
    """A message's content (or the system prompt) as blocks: {"text"}, {"image"} or {"json"}."""
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"text": content}]
    blocks = []
    for block in content if isinstance(content, list) else [content]:
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            blocks.append({"text": block["text"]})
        elif isinstance(block, dict) and (src := _image_src(block)):
            blocks.append({"image": src})
        else:
            blocks.append({"json": json.dumps(_shortened(block), indent=2, ensure_ascii=False)})
    return blocks


def readable_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    readable = []
    for message in messages:
        rest = {k: v for k, v in message.items() if k not in ("role", "content")}
        extra = json.dumps(_shortened(rest), indent=2, ensure_ascii=False) if rest else ""
        readable.append(
            {
                "role": message.get("role", "?"),
                "blocks": readable_content(message.get("content")),
                "extra": extra,
            }
        )
    return readable


@admin.register(AgentProfile)
class AgentProfileAdmin(TenantScopedAdmin):
    list_display = ["name", "tenant", "is_default", "version", "updated_at"]
    list_filter = ["tenant", "is_default"]
    search_fields = ["name", "scope"]
    readonly_fields = ["version", "created_at", "updated_at", "rendered"]
    fields = [
        "tenant",
        "name",
        "scope",
        "policy",
        "is_default",
        "version",
        "rendered",
        "created_at",
        "updated_at",
    ]
    change_list_template = "admin/context/agentprofile_change_list.html"
    add_roles = TenantScopedAdmin.change_roles
    delete_roles = TenantScopedAdmin.change_roles

    @admin.display(description="B1 as rendered")
    def rendered(self, obj: AgentProfile) -> str:
        return obj.render() if obj.pk else ""

    def save_model(self, request: HttpRequest, obj: AgentProfile, form: Any, change: bool) -> None:
        data = {name: form.cleaned_data[name] for name in ("name", "scope", "policy", "is_default")}
        try:
            if change:
                agent_profile_update(profile=AgentProfile.objects.get(pk=obj.pk), **data)
            else:
                created = agent_profile_create(tenant=form.cleaned_data["tenant"], **data)
                obj.pk = created.pk
        except ApplicationError as exc:
            self.message_user(request, exc.message, level="error")

    def get_urls(self) -> list[Any]:
        return [
            path("inspector/", self.admin_site.admin_view(self.inspector_view), name="context_inspector"),
            *super().get_urls(),
        ]

    def inspector_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_module_permission(request):
            raise PermissionDenied
        conversations = Conversation.objects.select_related("tenant", "end_user").order_by(
            "tenant__name", "-created_at"
        )
        if not request.user.is_superuser:
            conversations = conversations.filter(tenant__in=member_tenant_ids(request))
        grouped = request.user.is_superuser or len(member_tenant_ids(request)) > 1
        data = request.POST or (request.GET.dict() if "conversation" in request.GET else None)
        form = InspectorForm(data, conversations=conversations, grouped=grouped)
        result = error = None
        if form.is_bound and form.is_valid():
            try:
                # A dry run: nothing the inspector does may change the conversation's prompt or statistics.
                with transaction.atomic():
                    state = context_assemble(
                        conversation=form.cleaned_data["conversation"],
                        request=ContextRequest(
                            user_message=form.cleaned_data["user_message"],
                            token_budget=form.cleaned_data.get("token_budget"),
                            format=form.cleaned_data["format"],
                            record=False,
                        ),
                    )
                    result = context_payload(state)
                    transaction.set_rollback(True)
            except ApplicationError as exc:
                error = exc.message
        context = {
            **self.admin_site.each_context(request),
            "title": "Context inspector",
            "form": form,
            "result": result,
            "error": error,
            "system_blocks": readable_content(result["system"]) if result else [],
            "readable_messages": readable_messages(result["messages"]) if result else [],
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/context/inspector.html", context)


@admin.register(ConversationContext)
class ConversationContextAdmin(TenantScopedAdmin):
    tenant_lookup = "conversation__tenant"
    list_display = ["conversation", "agent_profile", "window_start_seq", "updated_at"]
    list_select_related = ["conversation", "agent_profile"]
    readonly_fields = ["conversation", "window_start_seq", "updated_at"]
    fields = ["conversation", "agent_profile", "window_start_seq", "updated_at"]
