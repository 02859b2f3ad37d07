"""Admin scoping: an admin user sees and edits only objects of the tenants it is a member of, with what
its role allows, and no choice, filter or action names another tenant's objects; superusers see everything.
Every tenant-owned ModelAdmin derives from TenantScopedAdmin (AppendOnlyAdmin for audit and derived rows)."""

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.contrib.admin.helpers import AdminForm
from django.contrib.admin.utils import get_fields_from_path
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models import Model, QuerySet
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest
from django.utils.html import format_html

from tenants.models import Membership, Tenant

if TYPE_CHECKING:  # the stubs' alias of str | lazy str (django-stubs is a development dependency)
    from django_stubs_ext import StrOrPromise

ALL_ROLES = (Membership.Role.OPERATOR, Membership.Role.SUPPORT)


def member_tenant_ids(request: HttpRequest, roles: tuple[str, ...] = ALL_ROLES) -> set[Any]:
    """Tenant ids where the request's user holds one of `roles` (memoised on the request)."""
    cache = getattr(request, "_mnemo_memberships", None)
    if cache is None:
        user_id = request.user.pk  # None for an anonymous user, who belongs to no tenant
        cache = (
            []
            if user_id is None
            else list(Membership.objects.filter(user_id=user_id).values_list("tenant_id", "role"))
        )
        request._mnemo_memberships = cache  # type: ignore[attr-defined]
    return {tenant_id for tenant_id, role in cache if role in roles}


def scoped_related_filter(admin_site: admin.AdminSite, model: type[Model], tenant_ids: set) -> dict | None:
    """The filter that keeps `model`'s rows inside `tenant_ids`, or None when the model is not tenant-owned:
    Tenant itself, a model with a scoped admin (its tenant_lookup), or one with a `tenant` field."""
    if model is Tenant:
        return {"pk__in": tenant_ids}
    model_admin = admin_site._registry.get(model)
    if isinstance(model_admin, TenantScopedAdmin):
        return model_admin._tenant_filter(tenant_ids)
    if any(f.name == "tenant" for f in model._meta.get_fields()):
        return {"tenant__in": tenant_ids}
    return None


class ScopedRelatedFieldListFilter(admin.RelatedFieldListFilter):
    """A "By <relation>" filter that offers only the user's tenants' objects (Django's lists every row)."""

    def field_choices(
        self, field: Any, request: HttpRequest, model_admin: Any
    ) -> list[tuple[str, "StrOrPromise"]]:
        ordering = self.field_admin_ordering(field, request, model_admin)
        limit = None
        if not request.user.is_superuser:
            tenant_ids = member_tenant_ids(request, model_admin.view_roles)
            limit = scoped_related_filter(model_admin.admin_site, field.related_model, tenant_ids)
        return field.get_choices(include_blank=False, ordering=ordering, limit_choices_to=limit)


class PrettyJSONField(forms.JSONField):
    """A JSON form field that shows its value indented (one key a line), not on one long line."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, InvalidJSONInput):
            return value
        return json_pretty(value, encoder=self.encoder)


def json_pretty(value: Any, *, encoder: Any = None) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, cls=encoder)


def readonly_json_display(field: models.JSONField, empty: str) -> Callable[[Any], str]:
    """A read-only field's display for a JSON model field: indented in the same monospace box as the
    editable ones (Django's own shows it on one line)."""

    def display(obj: Any) -> str:
        value = getattr(obj, field.attname, None)
        if value is None:
            return empty
        return format_html('<pre class="mnemo-json">{}</pre>', json_pretty(value, encoder=field.encoder))

    display.__name__ = field.name  # the row keeps the field's CSS class and help text
    display.short_description = field.verbose_name  # type: ignore[attr-defined]
    return display


def readonly_json_indented(adminform: AdminForm, model: type[Model], empty: str) -> None:
    """Swap the read-only JSON fields of a change form (a view-only user's, or declared read-only) for
    indented displays, in its fieldsets and its read-only list alike."""
    json_fields = {
        f.name: f for f in model._meta.get_fields() if isinstance(f, models.JSONField) and not f.is_relation
    }
    names = [name for name in adminform.readonly_fields if isinstance(name, str) and name in json_fields]
    if not names:
        return
    displays = {name: readonly_json_display(json_fields[name], empty) for name in names}

    def swap(entry: Any) -> Any:
        if isinstance(entry, list | tuple):
            return type(entry)(swap(e) for e in entry)
        return displays.get(entry, entry) if isinstance(entry, str) else entry

    adminform.fieldsets = [
        (title, {**options, "fields": swap(options.get("fields", ()))})
        for title, options in adminform.fieldsets
    ]
    adminform.readonly_fields = swap(list(adminform.readonly_fields))


class TenantScopedAdmin(admin.ModelAdmin):
    formfield_overrides = {
        models.JSONField: {
            "form_class": PrettyJSONField,
            "widget": forms.Textarea(attrs={"class": "mnemo-json", "rows": 12}),
        }
    }
    # Path from the model to its Tenant ("" for Tenant itself).
    tenant_lookup = "tenant"
    view_roles: tuple[str, ...] = ALL_ROLES
    change_roles: tuple[str, ...] = (Membership.Role.OPERATOR,)
    add_roles: tuple[str, ...] = ()
    delete_roles: tuple[str, ...] = ()

    def _tenant_filter(self, tenant_ids: set[Any]) -> dict[str, Any]:
        return {f"{self.tenant_lookup}__in" if self.tenant_lookup else "pk__in": tenant_ids}

    def _obj_tenant(self, obj: Any) -> Tenant:
        value = obj
        for step in self.tenant_lookup.split("__"):
            value = getattr(value, step)
        return value

    def _obj_tenant_id(self, obj: Any) -> Any:
        return self._obj_tenant(obj).pk if self.tenant_lookup else obj.pk

    def _allowed(self, request: HttpRequest, roles: tuple[str, ...], obj: Any = None) -> bool:
        if not request.user.is_active or not request.user.is_staff:
            return False
        tenant_ids = member_tenant_ids(request, roles)
        if obj is None:
            return bool(tenant_ids)
        return self._obj_tenant_id(obj) in tenant_ids

    def _scoped_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(**self._tenant_filter(member_tenant_ids(request, self.view_roles)))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser or self._allowed(request, self.view_roles)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if request.user.is_superuser:
            return True
        return self._allowed(request, self.view_roles, obj) or self.has_change_permission(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if request.user.is_superuser:
            return super().has_change_permission(request, obj)
        return self._allowed(request, self.change_roles, obj)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        if request.user.is_superuser:
            return super().has_add_permission(request, *args)
        return self._allowed(request, self.add_roles)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if request.user.is_superuser:
            return super().has_delete_permission(request, obj)
        return self._allowed(request, self.delete_roles, obj)

    def scoped_for(self, request: HttpRequest, queryset: QuerySet, roles: tuple[str, ...]) -> QuerySet:
        """The rows of `queryset` in tenants where the user holds one of `roles`: what an action may touch
        (the changelist shows the tenants of every role, so a selection may hold rows of others)."""
        if request.user.is_superuser:
            return queryset
        return queryset.filter(**self._tenant_filter(member_tenant_ids(request, roles)))

    def get_list_display(self, request: HttpRequest) -> Any:
        """Every tenant-owned list says whose each row is: a tenant column after the first."""
        columns = list(super().get_list_display(request))
        if self.tenant_lookup and not self._names_tenant(columns):
            columns.insert(min(1, len(columns)), "tenant_column")
        return columns

    @admin.display(description="Tenant")
    def tenant_column(self, obj: Any) -> str:
        return self._obj_tenant(obj).slug

    def get_list_filter(self, request: HttpRequest) -> Any:
        """A "By tenant" filter on every tenant-owned list; every filter on a relation offers only the
        user's tenants' objects (no other names leak)."""
        entries = list(super().get_list_filter(request))
        if self.tenant_lookup and not self._names_tenant(entries):
            entries.insert(0, self.tenant_lookup)
        return [self._scoped_list_filter(entry) for entry in entries]

    def _names_tenant(self, entries: list[Any]) -> bool:
        names = {entry[0] if isinstance(entry, tuple | list) else entry for entry in entries}
        return bool(names & {self.tenant_lookup, "tenant", "tenant_column"})

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = self._scoped_queryset(request)
        return qs.select_related(self.tenant_lookup) if self.tenant_lookup else qs

    def _scoped_list_filter(self, entry: Any) -> Any:
        if not isinstance(entry, str):
            return entry
        try:
            field = get_fields_from_path(self.model, entry)[-1]
        except FieldDoesNotExist:
            return entry
        return (entry, ScopedRelatedFieldListFilter) if field.is_relation else entry

    def render_change_form(
        self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Any:
        adminform = context.get("adminform")
        if isinstance(adminform, AdminForm):
            readonly_json_indented(adminform, self.model, self.get_empty_value_display())
        return super().render_change_form(request, context, *args, **kwargs)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[Any, Any, set[str], Any]:
        """Deleting a row the user may delete takes its append-only rows with it (a conversation's messages
        and segments): no one may delete those alone, so they do not count as permissions the user lacks."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        append_only = {
            str(model._meta.verbose_name)
            for model, model_admin in self.admin_site._registry.items()
            if isinstance(model_admin, AppendOnlyAdmin)
        }
        return deleted, counts, {name for name in perms_needed if str(name) not in append_only}, protected

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        """Choices for related objects stay inside the user's tenants too."""
        if not request.user.is_superuser:
            tenant_ids = member_tenant_ids(request, self.change_roles)
            limit = scoped_related_filter(self.admin_site, db_field.related_model, tenant_ids)
            if limit is not None:
                kwargs["queryset"] = db_field.related_model._default_manager.filter(**limit)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class AppendOnlyAdmin(TenantScopedAdmin):
    """Audit and derived rows (memory operations, cache usage, summary segments, messages…): written by the
    services that record them, never added or deleted by hand, superusers included."""

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
