"""Admin for support staff and operators: core memory blocks and archival memories are edited through the
memory services (version-checked, logged as MemoryOperations), and any operation can be reverted."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.html import format_html_join
from django.utils.http import urlencode
from django.utils.text import Truncator

from memory.archival import archival_update
from memory.models import Actor, ArchivalMemory, CoreMemoryBlock, MemoryOperation
from memory.revert import operation_revert
from memory.services import core_memory_write
from tenants.admin_scoping import ALL_ROLES, AppendOnlyAdmin, TenantScopedAdmin
from tenants.errors import ApplicationError


class CoreMemoryBlockForm(forms.ModelForm):
    # The version the editor loaded: a save on a stale form is refused, never an overwrite.
    expected_version = forms.IntegerField(widget=forms.HiddenInput, required=False)
    reason = forms.CharField(required=False, max_length=1000, help_text="Why (kept in the operation log).")

    class Meta:
        model = CoreMemoryBlock
        fields = ["end_user", "label", "value", "char_limit"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["expected_version"].initial = self.instance.version

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        value = data.get("value") or ""
        limit = data.get("char_limit") or self.instance.char_limit
        if len(value) > limit:
            self.add_error("value", f"{len(value)} characters: over the block's limit of {limit}.")
        if self.instance.pk is not None:
            current = (
                CoreMemoryBlock.objects.filter(pk=self.instance.pk).values_list("version", flat=True).first()
            )
            if data.get("expected_version") != current:
                raise forms.ValidationError(
                    f"Someone changed this block since you opened it (now version {current}). "
                    "Reload the page and apply your edit again.",
                    code="version_mismatch",
                )
        return data


@admin.register(CoreMemoryBlock)
class CoreMemoryBlockAdmin(TenantScopedAdmin):
    form = CoreMemoryBlockForm
    change_roles = ALL_ROLES
    list_display = ("label", "end_user", "version", "chars", "char_limit", "updated_by", "updated_at")
    list_filter = ("label",)
    search_fields = ("end_user__external_id", "label", "value")
    list_select_related = ("end_user",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        base = ("version", "updated_by", "updated_at", "history")
        return ("end_user", "label", *base) if obj is not None else base

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        fields = ["value", "char_limit", "expected_version", "reason"]
        head = ["end_user", "label"]
        return [*head, *fields, "version", "updated_by", "updated_at", *(["history"] if obj else [])]

    @admin.display(description="chars")
    def chars(self, obj: CoreMemoryBlock) -> int:
        return len(obj.value)

    def history_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> Any:
        """One history for a block: its operation log, which records every write (API, memory
        agent, admin, revert). Django's own log saw none of them ("no change history")."""
        block = self.get_object(request, unquote(object_id))
        if block is None:
            return super().history_view(request, object_id, extra_context)
        url = reverse("admin:memory_memoryoperation_changelist")
        query = urlencode({"end_user__id__exact": block.end_user_id, "target": f"core:{block.label}"})
        return redirect(f"{url}?{query}")

    @admin.display(description="History")
    def history(self, obj: CoreMemoryBlock) -> str:
        ops = MemoryOperation.objects.filter(end_user_id=obj.end_user_id, target=f"core:{obj.label}")[:20]
        return format_html_join(
            "\n",
            "<div>{} · {} · {} ({}): {} → {}</div>",
            (
                (
                    op.created_at.strftime("%Y-%m-%d %H:%M"),
                    op.op,
                    op.actor,
                    op.actor_name,
                    Truncator(op.old_value).chars(60),
                    Truncator(op.new_value).chars(60),
                )
                for op in ops
            ),
        )

    def save_model(self, request: HttpRequest, obj: CoreMemoryBlock, form: Any, change: bool) -> None:
        data = form.cleaned_data
        try:
            block, _ = core_memory_write(
                end_user=obj.end_user,
                label=obj.label,
                value=obj.value,
                char_limit=obj.char_limit,
                expected_version=data.get("expected_version") if change else None,
                create=not change,
                require_version=change,
                actor=Actor.ADMIN,
                actor_name=request.user.get_username(),
                trigger=data.get("reason") or "",
            )
        except ApplicationError as exc:
            # Lost a race after the form's own check: nothing was written.
            messages.error(request, exc.message)
            return
        obj.pk, obj.version = block.pk, block.version


class ArchivalMemoryForm(forms.ModelForm):
    expected_updated_at = forms.CharField(widget=forms.HiddenInput, required=False)
    reason = forms.CharField(required=False, max_length=1000, help_text="Why (kept in the operation log).")

    class Meta:
        model = ArchivalMemory
        fields = ["content", "kind", "importance"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["expected_updated_at"].initial = self.instance.updated_at.isoformat()

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if self.instance.pk is not None:
            current = (
                ArchivalMemory.objects.filter(pk=self.instance.pk)
                .values_list("updated_at", flat=True)
                .first()
            )
            if current is None or data.get("expected_updated_at") != current.isoformat():
                raise forms.ValidationError(
                    "Someone changed this memory since you opened it. Reload the page and apply your edit "
                    "again.",
                    code="version_mismatch",
                )
        return data


# Not "Archival memorys": the admin's label, without a migration of the memory app's model options.
ArchivalMemory._meta.verbose_name_plural = "archival memories"


@admin.register(ArchivalMemory)
class ArchivalMemoryAdmin(TenantScopedAdmin):
    form = ArchivalMemoryForm
    change_roles = ALL_ROLES
    list_display = (
        "short_content",
        "end_user",
        "kind",
        "subject",
        "importance",
        "mentions",
        "invalidated_at",
    )
    list_filter = ("kind", ("invalidated_at", admin.EmptyFieldListFilter))
    search_fields = ("end_user__external_id", "content", "subject")
    list_select_related = ("end_user",)
    readonly_fields = ("end_user", "subject", "mentions", "embedding_model", "created_at", "invalidated_at")
    fields = (
        "end_user",
        "content",
        "kind",
        "importance",
        "expected_updated_at",
        "reason",
        "subject",
        "mentions",
        "embedding_model",
        "created_at",
        "invalidated_at",
    )

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False  # memories arrive through the API and the memory agent (merge and invalidation rules)

    @admin.display(description="content")
    def short_content(self, obj: ArchivalMemory) -> str:
        return Truncator(obj.content).chars(80)

    def save_model(self, request: HttpRequest, obj: ArchivalMemory, form: Any, change: bool) -> None:
        try:
            archival_update(
                memory=obj,
                content=obj.content,
                kind=obj.kind,
                importance=obj.importance,
                actor=Actor.ADMIN,
                actor_name=request.user.get_username(),
                trigger=form.cleaned_data.get("reason") or "",
            )
        except ApplicationError as exc:
            messages.error(request, exc.message)


@admin.register(MemoryOperation)
class MemoryOperationAdmin(AppendOnlyAdmin):
    change_roles = ()
    # Reverting is editing the memory (through the services, which log it): the memory admins' rule.
    revert_roles = ALL_ROLES
    list_display = (
        "created_at",
        "end_user",
        "op",
        "target",
        "actor",
        "actor_name",
        "short_new",
        "reverted_by",
    )
    list_filter = ("op", "actor")
    search_fields = ("end_user__external_id", "target", "new_value", "old_value")
    list_select_related = ("end_user",)
    actions = ["revert"]

    @admin.display(description="new value")
    def short_new(self, obj: MemoryOperation) -> str:
        return Truncator(obj.new_value).chars(80)

    def has_revert_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser or self._allowed(request, self.revert_roles)

    @admin.action(description="Revert the selected operations", permissions=["revert"])
    def revert(self, request: HttpRequest, queryset: QuerySet[MemoryOperation]) -> None:
        for operation in self.scoped_for(request, queryset, self.revert_roles).order_by("-created_at", "-id"):
            try:
                operation_revert(
                    operation=operation, actor=Actor.ADMIN, actor_name=request.user.get_username()
                )
            except ApplicationError as exc:
                messages.error(request, f"{operation.target}: {exc.message}")
            else:
                messages.success(request, f"Reverted {operation.op} on {operation.target}.")
