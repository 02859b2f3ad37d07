from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from tenants.admin_scoping import TenantScopedAdmin
from tenants.models import ApiKey, EndUser, Membership, Tenant
from tenants.services import api_key_create, api_key_revoke


@admin.register(Tenant)
class TenantAdmin(TenantScopedAdmin):
    tenant_lookup = ""
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    readonly_fields = ["id", "created_at"]
    fields = ["id", "slug", "name", "settings", "created_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # Operators tune their tenant's settings; renaming the slug is for superusers.
        if request.user.is_superuser:
            return self.readonly_fields
        return [*self.readonly_fields, "slug"]


@admin.register(EndUser)
class EndUserAdmin(TenantScopedAdmin):
    list_display = ["external_id", "tenant", "created_at"]
    list_filter = ["tenant"]
    search_fields = ["external_id"]
    list_select_related = ["tenant"]
    readonly_fields = ["tenant", "external_id", "created_at"]


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin):
    list_display = ["__str__", "tenant", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["tenant", ("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["tenant"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    fields = ["tenant", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]
    add_roles = TenantScopedAdmin.change_roles

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        # A new key goes through the service so it is generated and hashed the one way; the raw key is
        # shown once, here, and never again.
        key, raw_key = api_key_create(tenant=obj.tenant, name=obj.name)
        obj.pk = key.pk
        obj.__dict__.update({f.attname: getattr(key, f.attname) for f in ApiKey._meta.concrete_fields})
        messages.warning(request, f"New API key (shown once, copy it now): {raw_key}")

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key in queryset:
            api_key_revoke(api_key=key)
        messages.success(request, f"Revoked {queryset.count()} key(s).")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    # Who may administer which tenant is decided by superusers only (default Django permissions).
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    list_select_related = ["user", "tenant"]
    autocomplete_fields = ["user"]
