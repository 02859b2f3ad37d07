from typing import Any

from axes.admin import AccessAttemptAdmin, AccessLogAdmin
from axes.models import AccessAttempt, AccessLog
from axes.utils import reset as axes_reset
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import HttpRequest

from tenants.admin_scoping import TenantScopedAdmin, member_tenant_ids
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


# --- Admin login lockouts (django-axes) ---------------------------------------------------------------------
# Attempts and logins name admin users of every tenant, with their addresses: superusers see them all. An
# operator sees, and may lift, only the lockouts of usernames that belong to its tenants alone: not
# superusers, and not someone who also administers a tenant the operator does not, since lifting a lockout
# lets the guessing go on.


def lockout_usernames(request: HttpRequest) -> set[str]:
    """Usernames whose login attempts the request's (non-superuser) user may see and reset (memoised)."""
    cache = getattr(request, "_mnemo_lockout_usernames", None)
    if cache is None:
        cache = set()
        tenant_ids = member_tenant_ids(request, (Membership.Role.OPERATOR,))
        if tenant_ids and request.user.is_active and request.user.is_staff:
            user_model = get_user_model()
            elsewhere = Membership.objects.exclude(tenant_id__in=tenant_ids).values("user_id")
            cache = set(
                user_model._default_manager.filter(memberships__tenant_id__in=tenant_ids, is_superuser=False)
                .exclude(pk__in=elsewhere)
                .values_list(user_model.USERNAME_FIELD, flat=True)
            )
        request._mnemo_lockout_usernames = cache  # type: ignore[attr-defined]
    return cache


class LoginAttemptAdmin(AccessAttemptAdmin):
    actions = ["lift_lockout", "cleanup_expired_attempts"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(username__in=lockout_usernames(request))

    def _operator_allowed(self, request: HttpRequest, obj: Any = None) -> bool:
        usernames = lockout_usernames(request)
        return bool(usernames) if obj is None else obj.username in usernames

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser or self._operator_allowed(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser or self._operator_allowed(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # every field is read-only; lifting is deleting

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser or self._operator_allowed(request, obj)

    def get_actions(self, request: HttpRequest) -> dict:
        actions = super().get_actions(request)
        if not request.user.is_superuser:
            # It cleans every tenant's expired attempts.
            actions.pop("cleanup_expired_attempts", None)
        return actions

    @admin.action(
        description="Lift the lockout of the selected usernames and addresses", permissions=("delete",)
    )
    def lift_lockout(self, request: HttpRequest, queryset: QuerySet[AccessAttempt]) -> None:
        pairs = set(queryset.values_list("username", "ip_address"))
        for username, ip_address in pairs:
            # axes' own reset, so it also clears what another handler (a cache) would keep.
            axes_reset(username=username, ip=ip_address)
        messages.success(request, f"Lifted {len(pairs)} lockout(s).")


class LoginLogAdmin(AccessLogAdmin):
    """Successful admin logins and logouts: superusers only."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser


admin.site.register(AccessAttempt, LoginAttemptAdmin)
admin.site.register(AccessLog, LoginLogAdmin)
