"""Admin scoping: an admin user sees and edits only objects of the tenants it is a member of, with what
its role allows; superusers see everything. Every tenant-owned ModelAdmin derives from TenantScopedAdmin."""

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from tenants.models import Membership, Tenant

ALL_ROLES = (Membership.Role.OPERATOR, Membership.Role.SUPPORT)


def member_tenant_ids(request: HttpRequest, roles: tuple[str, ...] = ALL_ROLES) -> set[Any]:
    """Tenant ids where the request's user holds one of `roles` (memoised on the request)."""
    cache = getattr(request, "_mnemo_memberships", None)
    if cache is None:
        cache = list(Membership.objects.filter(user_id=request.user.pk).values_list("tenant_id", "role"))
        request._mnemo_memberships = cache  # type: ignore[attr-defined]
    return {tenant_id for tenant_id, role in cache if role in roles}


class TenantScopedAdmin(admin.ModelAdmin):
    # Path from the model to its Tenant ("" for Tenant itself).
    tenant_lookup = "tenant"
    view_roles: tuple[str, ...] = ALL_ROLES
    change_roles: tuple[str, ...] = (Membership.Role.OPERATOR,)
    add_roles: tuple[str, ...] = ()
    delete_roles: tuple[str, ...] = ()

    def _tenant_filter(self, tenant_ids: set[Any]) -> dict[str, Any]:
        return {f"{self.tenant_lookup}__in" if self.tenant_lookup else "pk__in": tenant_ids}

    def _obj_tenant_id(self, obj: Any) -> Any:
        if not self.tenant_lookup:
            return obj.pk
        value = obj
        for step in self.tenant_lookup.split("__"):
            value = getattr(value, step)
        return value.pk

    def _allowed(self, request: HttpRequest, roles: tuple[str, ...], obj: Any = None) -> bool:
        if not request.user.is_active or not request.user.is_staff:
            return False
        tenant_ids = member_tenant_ids(request, roles)
        if obj is None:
            return bool(tenant_ids)
        return self._obj_tenant_id(obj) in tenant_ids

    def get_queryset(self, request: HttpRequest) -> QuerySet:
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

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        """Choices for related objects stay inside the user's tenants too."""
        if not request.user.is_superuser:
            related = db_field.related_model
            tenant_ids = member_tenant_ids(request, self.change_roles)
            if related is Tenant:
                kwargs["queryset"] = Tenant.objects.filter(pk__in=tenant_ids)
            elif any(f.name == "tenant" for f in related._meta.get_fields()):
                kwargs["queryset"] = related._default_manager.filter(tenant__in=tenant_ids)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)
