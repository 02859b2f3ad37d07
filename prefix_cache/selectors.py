"""Reads: cache statistics per model, day or conversation."""

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import Count, F, Sum
from django.db.models.functions import Abs, Coalesce, TruncDate

from prefix_cache.models import CacheUsage
from prefix_cache.pricing import savings_usd
from tenants.models import Tenant

GROUPS = ("model", "day", "conversation")


def cache_stats(
    *, tenant: Tenant, group_by: str, since: datetime | None = None, until: datetime | None = None
) -> list[dict[str, Any]]:
    """Hit rate, cached tokens, prediction error and savings, over context calls whose usage was reported."""
    qs = CacheUsage.objects.filter(tenant=tenant, reported_at__isnull=False)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    if until is not None:
        qs = qs.filter(created_at__lt=until)
    key_expr = {"model": F("model"), "day": TruncDate("created_at"), "conversation": F("conversation_id")}[
        group_by
    ]
    rows = (
        qs.annotate(group_key=key_expr)
        .values("group_key", "model")
        .annotate(
            requests=Count("id"),
            prompt=Sum("prompt_tokens"),
            cached=Sum("cached_tokens"),
            written=Sum(Coalesce("cache_write_tokens", 0)),
            predicted=Sum("predicted_cacheable_tokens"),
            abs_error=Sum(Abs(F("predicted_cacheable_tokens") - F("cached_tokens"))),
        )
        .order_by("group_key", "model")
    )
    groups = _groups_sum(rows)
    return sorted((_group_stats(key, g) for key, g in groups.items()), key=lambda r: r["key"])


def _groups_sum(rows: Iterable[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """The (group, model) rows summed per group, with the savings of the priced models and the names of
    the others."""
    groups: dict[Any, dict[str, Any]] = defaultdict(
        lambda: {
            "requests": 0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "cache_write_tokens": 0,
            "predicted_cacheable_tokens": 0,
            "abs_error": 0,
            "savings_usd": 0.0,
            "unpriced_models": set(),
        }
    )
    for row in rows:
        g = groups[row["group_key"]]
        g["requests"] += row["requests"]
        g["prompt_tokens"] += row["prompt"] or 0
        g["cached_tokens"] += row["cached"] or 0
        g["cache_write_tokens"] += row["written"] or 0
        g["predicted_cacheable_tokens"] += row["predicted"] or 0
        g["abs_error"] += row["abs_error"] or 0
        saved = savings_usd(
            model=row["model"], cached_tokens=row["cached"] or 0, cache_write_tokens=row["written"] or 0
        )
        if saved is None:
            g["unpriced_models"].add(row["model"])
        else:
            g["savings_usd"] += saved
    return groups


def _group_stats(key: Any, g: dict[str, Any]) -> dict[str, Any]:
    prompt = g["prompt_tokens"]
    return {
        "key": str(key),
        "requests": g["requests"],
        "prompt_tokens": prompt,
        "cached_tokens": g["cached_tokens"],
        "cache_write_tokens": g["cache_write_tokens"],
        "hit_rate": round(g["cached_tokens"] / prompt, 4) if prompt else 0.0,
        "predicted_cacheable_tokens": g["predicted_cacheable_tokens"],
        "prediction_mean_abs_error_tokens": round(g["abs_error"] / g["requests"], 1),
        "prediction_error_rate": round(g["abs_error"] / prompt, 4) if prompt else 0.0,
        "savings_usd": round(g["savings_usd"], 6),
        "unpriced_models": sorted(g["unpriced_models"]),
    }
