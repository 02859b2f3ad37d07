"""Admin: prefix hints, cache usage rows and the cache dashboard (hit rate over time, predicted vs actual,
and per tenant the charts)."""

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Sum
from django.db.models.functions import TruncDate
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from cold_storage.models import ArchivedImage
from conversations.models import Message
from prefix_cache.context_stats import context_call_days, degradation_days
from prefix_cache.models import CacheUsage, PrefixHint
from prefix_cache.selectors import cache_stats
from prefix_cache.services import CONTEXT_STATS_DAYS
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
            **(dashboard_charts(tenant, days) if tenant else {}),
            **(context_call_charts(tenant) if tenant else {}),
            "stats_days": CONTEXT_STATS_DAYS,
            "title": "Prefix cache dashboard",
            "tenants": tenants,
            "tenant": tenant,
            "days": days,
            "models": models,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/prefix_cache/dashboard.html", context)


# --- Charts: server-side SVG, no script and no CDN. Lines and bars take the palette below, text
# and axes take currentColor, so they read in the admin's light and dark themes alike.
CHART_W, CHART_H, PAD = 640, 180, 36
PALETTE = ("#3f8fd2", "#d99a1e", "#3aa55d", "#c5504b", "#8a6fd1")


def _scale(values: Sequence[float], top: float) -> list[float]:
    return [CHART_H - PAD - (v / top) * (CHART_H - 2 * PAD) if top else CHART_H - PAD for v in values]


def line_chart(labels: list[str], series: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """Polylines of `series` over `labels` (a point per label), with the y maximum for the axis."""
    top = max((v for values in series.values() for v in values), default=0) or 1
    step = (CHART_W - 2 * PAD) / max(len(labels) - 1, 1)
    xs = [PAD + i * step for i in range(len(labels))]
    lines = []
    for (name, values), color in zip(series.items(), PALETTE, strict=False):
        dots = list(zip(xs, _scale(values, top), strict=True))  # a day alone is a dot, not a line
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in dots)
        last = values[-1] if values else 0
        lines.append({"name": name, "color": color, "points": points, "dots": dots, "last": last})
    ticks = [{"x": x, "label": label} for x, label in zip(xs, labels, strict=True)][:: max(len(xs) // 6, 1)]
    return {"w": CHART_W, "h": CHART_H, "pad": PAD, "top": top, "lines": lines, "ticks": ticks,
            "base": CHART_H - PAD, "right": CHART_W - PAD}  # fmt: skip


def bar_chart(bars: list[tuple[str, float]], unit: str = "") -> dict[str, Any]:
    top = max((v for _, v in bars), default=0) or 1
    width = min((CHART_W - 2 * PAD) / max(len(bars), 1), 80)
    items = []
    for i, (label, value) in enumerate(bars):
        y = _scale([value], top)[0]
        items.append({"x": PAD + i * width + 2, "y": y, "w": max(width - 4, 1), "h": CHART_H - PAD - y,
                      "label": label, "value": value, "color": PALETTE[0]})  # fmt: skip
    return {"w": CHART_W, "h": CHART_H, "pad": PAD, "top": top, "bars": items, "unit": unit,
            "base": CHART_H - PAD, "right": CHART_W - PAD}  # fmt: skip


def dashboard_charts(tenant: Tenant, days: list[dict[str, Any]]) -> dict[str, Any]:
    """The tenant's days as charts: tokens sent, cached and predicted cacheable; compactions a day; image
    storage by tier."""

    labels = [str(row["key"]) for row in days]
    tokens = line_chart(
        labels,
        {
            "prompt tokens": [row["prompt_tokens"] for row in days],
            "cached (actual)": [row["cached_tokens"] for row in days],
            "cacheable (predicted)": [row["predicted_cacheable_tokens"] for row in days],
        },
    )
    boundaries = (
        Message.objects.filter(conversation__tenant=tenant, kind=Message.Kind.COMPACT_BOUNDARY)
        .annotate(day=TruncDate("created_at"))
        .values("day")
        .annotate(n=Count("id"))
        .order_by("day")
    )
    storage = (
        ArchivedImage.objects.filter(tenant=tenant).values("tier").annotate(size=Sum("size")).order_by("tier")
    )
    return {
        "tokens_chart": tokens if days else None,
        "compactions_chart": bar_chart([(str(r["day"]), r["n"]) for r in boundaries]) if boundaries else None,
        "storage_chart": bar_chart([(r["tier"], r["size"] or 0) for r in storage], "bytes")
        if storage
        else None,
    }


# The degradations chart draws this many codes by name (the palette's colours) and adds up the rest.
DEGRADATION_SERIES = len(PALETTE) - 1


def context_call_charts(tenant: Tenant) -> dict[str, Any]:
    """The tenant's context calls a day from the hourly rollups: latency p50 and p95 (milliseconds), and
    the calls that took each fallback, by degradation code (the most frequent by name, then "other")."""
    since = timezone.now() - timedelta(days=CONTEXT_STATS_DAYS)
    calls = context_call_days(tenant=tenant, since=since)
    if not calls:
        return {"latency_chart": None, "degradations_chart": None}
    labels = [str(row["day"]) for row in calls]
    latency = line_chart(
        labels,
        {"p50 (ms)": [row["p50"] or 0 for row in calls], "p95 (ms)": [row["p95"] or 0 for row in calls]},
    )
    by_code = degradation_days(tenant=tenant, since=since)
    named = list(by_code.items())[:DEGRADATION_SERIES]
    rest = list(by_code.values())[DEGRADATION_SERIES:]
    series = {code: [per_day.get(row["day"], 0) for row in calls] for code, per_day in named}
    if rest:
        series["other"] = [sum(per_day.get(row["day"], 0) for per_day in rest) for row in calls]
    return {"latency_chart": latency, "degradations_chart": line_chart(labels, series) if series else None}
