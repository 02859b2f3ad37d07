"""Reads of the hourly context-call rollups (ContextCallHour, DegradationHour): calls and latency
percentiles per day, degradations per day and code. Kept apart from selectors.py, the cache statistics."""

from collections import defaultdict
from datetime import date, datetime
from typing import Any

from django.db.models import Max, Sum
from django.db.models.functions import TruncDate

from prefix_cache.models import LATENCY_EDGES_MS, ContextCallHour, DegradationHour
from tenants.models import Tenant

BUCKET_FIELDS = [f"ms_le_{edge}" for edge in LATENCY_EDGES_MS] + ["ms_over"]


def latency_percentile(counts: list[int], q: float, *, max_ms: float) -> float | None:
    """The q-quantile (0 < q <= 1) of a histogram over LATENCY_EDGES_MS (`counts` in BUCKET_FIELDS order),
    interpolated linearly inside its bucket as Prometheus' histogram_quantile does; the last bucket ends
    at the largest call seen, and no answer exceeds it. None for an empty histogram."""
    total = sum(counts)
    if not total:
        return None
    rank = q * total
    seen = 0
    lower = 0.0
    for count, upper_edge in zip(counts, [*LATENCY_EDGES_MS, None], strict=True):
        upper = float(upper_edge) if upper_edge is not None else max(max_ms, lower)
        if count and seen + count >= rank:
            value = lower + (upper - lower) * (rank - seen) / count
            return round(min(value, max_ms), 1)
        seen += count
        lower = upper
    return round(max_ms, 1)  # q > 1


def context_call_days(*, tenant: Tenant, since: datetime) -> list[dict[str, Any]]:
    """Per day (UTC) from `since`: the tenant's context calls, p50, p95 and the slowest, in milliseconds."""
    rows = (
        ContextCallHour.objects.filter(tenant=tenant, hour__gte=since)
        .annotate(day=TruncDate("hour"))
        .values("day")
        .annotate(
            n=Sum("calls"),
            slowest=Max("latency_ms_max"),
            **{f"sum_{name}": Sum(name) for name in BUCKET_FIELDS},
        )
        .order_by("day")
    )
    days = []
    for row in rows:
        counts = [row[f"sum_{name}"] or 0 for name in BUCKET_FIELDS]
        slowest = row["slowest"] or 0.0
        days.append(
            {
                "day": row["day"],
                "calls": row["n"] or 0,
                "p50": latency_percentile(counts, 0.5, max_ms=slowest),
                "p95": latency_percentile(counts, 0.95, max_ms=slowest),
                "max": slowest,
            }
        )
    return days


def degradation_days(*, tenant: Tenant, since: datetime) -> dict[str, dict[date, int]]:
    """Per degradation code, the tenant's context calls that reported it, per day (UTC) from `since`; codes
    with the most calls first."""
    rows = (
        DegradationHour.objects.filter(tenant=tenant, hour__gte=since)
        .annotate(day=TruncDate("hour"))
        .values("code", "day")
        .annotate(n=Sum("count"))
        .order_by("day", "code")
    )
    by_code: dict[str, dict[date, int]] = defaultdict(dict)
    for row in rows:
        by_code[row["code"]][row["day"]] = row["n"] or 0
    return dict(sorted(by_code.items(), key=lambda item: (-sum(item[1].values()), item[0])))
