"""Admin: prefix hints, cache usage rows and the cache dashboard (hit rate over time, predicted vs actual)."""

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path

from prefix_cache.models import CacheUsage, PrefixHint
from prefix_cache.selectors import cache_stats
from tenants.admin_scoping import ALL_ROLES, AppendOnlyAdmin, member_tenant_ids
from tenants.models import Tenant


class ReadOnlyScopedAdmin(AppendOnlyAdmin):
    change_roles: tuple[str, ...] = ()

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(PrefixHint)
class PrefixHintAdmin(ReadOnlyScopedAdmin):
    list_display = ["level", "short_hash", "token_count", "hits", "tenant", "first_seen", "last_seen"]
    list_filter = ["tenant", "level"]
    ordering = ["-last_seen"]

    @admin.display(description="hash")
    def short_hash(self, obj: PrefixHint) -> str:
        return obj.hash[:16] + "…"


@admin.register(CacheUsage)
class CacheUsageAdmin(ReadOnlyScopedAdmin):
    list_display = [
        "created_at",
        "conversation",
        "model",
        "prompt_tokens",
        "cached_tokens",
        "predicted_cacheable_tokens",
        "hint_level",
    ]
    list_filter = ["tenant", "provider", "model", "hint_level"]
    list_select_related = ["conversation"]
    ordering = ["-created_at"]
    change_list_template = "admin/prefix_cache/cacheusage_change_list.html"

    def get_urls(self) -> list[Any]:
        return [
            path(
                "dashboard/", self.admin_site.admin_view(self.dashboard_view), name="prefix_cache_dashboard"
            ),
            *super().get_urls(),
        ]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_module_permission(request):
            raise PermissionDenied
        tenants = Tenant.objects.order_by("slug")
        if not request.user.is_superuser:
            tenants = tenants.filter(pk__in=member_tenant_ids(request, ALL_ROLES))
        tenant = tenants.filter(slug=request.GET.get("tenant")).first() or tenants.first()
        days = cache_stats(tenant=tenant, group_by="day") if tenant else []
        models = cache_stats(tenant=tenant, group_by="model") if tenant else []
        for row in days:
            row["hit_pct"] = round(row["hit_rate"] * 100, 1)
            predicted_share = (
                row["predicted_cacheable_tokens"] / row["prompt_tokens"] if row["prompt_tokens"] else 0
            )
            row["predicted_pct"] = round(predicted_share * 100, 1)
        context = {
            **self.admin_site.each_context(request),
            "title": "Prefix cache dashboard",
            "tenants": tenants,
            "tenant": tenant,
            "days": days,
            "models": models,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/prefix_cache/dashboard.html", context)
