"""Writes: PrefixHint bookkeeping, CacheUsage (predicted on assembly, actual when usage arrives) and the
hourly rollups of context calls the dashboard draws."""

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, models, transaction
from django.db.models import F, FloatField, Q, Value
from django.db.models.functions import Greatest
from django.utils import timezone
from rest_framework import status

from conversations.models import Conversation
from prefix_cache.models import (
    CacheUsage,
    ContextCallHour,
    DegradationHour,
    PrefixHint,
    latency_bucket_field,
)
from prefix_cache.usage import usage_parse
from providers.metrics import cache_usage_observe
from providers.model_table import model_info
from tenants.errors import ApplicationError
from tenants.models import Tenant

logger = logging.getLogger(__name__)

# Hourly context-call rollups older than this are deleted by the daily prune (prefix_cache.tasks).
CONTEXT_STATS_DAYS = 90


@dataclass(frozen=True)
class PrefixLevel:
    level: str
    hash: str
    tokens: int


@dataclass(frozen=True)
class PrefixMatch:
    level: str | None  # the deepest whole level sent before, or None
    chain_index: int | None  # the last history message up to which this prompt was sent before


def prefix_hints_record(
    *, tenant: Tenant, levels: list[PrefixLevel], chain: list[str] | None = None
) -> PrefixMatch:
    """Count this request's prefixes and find what the tenant sent before: the deepest whole level, and
    along the hash chain of the history (one hash per stored message, each over the one before) the longest
    prefix some earlier prompt carried — the part a provider can serve from its cache. Three queries."""
    now = timezone.now()
    chain = chain or []
    chain_levels = [PrefixHint.Level.B6, PrefixHint.Level.PROMPT]
    rows = PrefixHint.objects.filter(tenant=tenant).filter(
        Q(level__in=[lv.level for lv in levels], hash__in=[lv.hash for lv in levels])
        | Q(level__in=chain_levels, hash__in=chain)
    )
    known = set(rows.values_list("level", "hash"))
    hit = None
    for lv in levels:
        if (lv.level, lv.hash) not in known:
            break  # a deeper level cannot match when a shallower one did not
        hit = lv.level
    seen_chain = {h for level, h in known if level in chain_levels}
    chain_index = next((i for i in range(len(chain) - 1, -1, -1) if chain[i] in seen_chain), None)

    seen = [lv for lv in levels if (lv.level, lv.hash) in known]
    if seen:
        PrefixHint.objects.filter(tenant=tenant, hash__in={lv.hash for lv in seen}).update(
            hits=F("hits") + 1, last_seen=now
        )
    new = [lv for lv in levels if (lv.level, lv.hash) not in known]
    if new:
        # Two requests may race to create the same hint; the loser's row is simply not inserted.
        PrefixHint.objects.bulk_create(
            [
                PrefixHint(
                    tenant=tenant,
                    level=lv.level,
                    hash=lv.hash,
                    token_count=lv.tokens,
                    first_seen=now,
                    last_seen=now,
                )
                for lv in new
            ],
            ignore_conflicts=True,
        )
    return PrefixMatch(level=hit, chain_index=chain_index)


def cache_usage_open(
    *,
    conversation: Conversation,
    provider: str,
    model: str,
    predicted_prompt_tokens: int,
    predicted_cacheable_tokens: int,
    prefix_hash: str,
    hint_level: str | None,
) -> CacheUsage:
    return CacheUsage.objects.create(
        tenant_id=conversation.tenant_id,
        conversation=conversation,
        provider=provider,
        model=model,
        predicted_prompt_tokens=predicted_prompt_tokens,
        predicted_cacheable_tokens=predicted_cacheable_tokens,
        prefix_hash=prefix_hash,
        hint_level=hint_level or "",
    )


def cache_usage_report(
    *, conversation: Conversation, usage: object, provider: str | None = None, context_id: object = None
) -> CacheUsage:
    """Record the provider's usage against the context call it answers: the one named by context_id, else
    the conversation's latest call still waiting for usage, else a new row with no prediction."""
    info = model_info(conversation.model)
    default_provider = {"anthropic": "anthropic", "google": "gemini"}.get(info.provider, "openai")
    parsed = usage_parse(usage, provider=provider, default_provider=default_provider)
    with transaction.atomic():
        pending = CacheUsage.objects.select_for_update().filter(conversation=conversation)
        if context_id is not None:
            row = pending.filter(pk=context_id).first()
            if row is None:
                raise ApplicationError(
                    "No context call with that id in this conversation.",
                    code="not_found",
                    status_code=status.HTTP_404_NOT_FOUND,
                )
            if row.reported_at is not None:
                raise ApplicationError(
                    "Usage for this context call was already reported.",
                    code="usage_already_reported",
                    status_code=status.HTTP_409_CONFLICT,
                )
        else:
            row = pending.filter(reported_at__isnull=True).order_by("-created_at").first()
            if row is None:
                row = CacheUsage(
                    tenant_id=conversation.tenant_id, conversation=conversation, model=conversation.model
                )
        matched = not row._state.adding  # a context call's row, with its prediction
        row.provider = parsed.provider
        row.prompt_tokens = parsed.prompt_tokens
        row.cached_tokens = parsed.cached_tokens
        row.cache_write_tokens = parsed.cache_write_tokens
        row.completion_tokens = parsed.completion_tokens
        row.reported_at = timezone.now()
        row.save()
    cache_usage_observe(
        provider=row.provider,
        matched=matched,
        predicted_tokens=row.predicted_cacheable_tokens,
        cached_tokens=row.cached_tokens,
    )
    return row


# --- Context-call rollups (#18 item 8): latency and degradations per tenant and hour ---------------------


def _bump(
    model: type[models.Model], key: dict[str, Any], increments: dict[str, Any], first: dict[str, Any]
) -> None:
    """Add to the counters of the row at `key`, creating it with `first` when it is missing. Race-safe on
    SQLite and PostgreSQL alike: the UPDATE is atomic in the database, and a creation that loses to another
    process's (the unique key) falls back to the UPDATE."""
    if model._default_manager.filter(**key).update(**increments):
        return
    try:
        with transaction.atomic():
            model._default_manager.create(**key, **first)
            return
    except IntegrityError:
        pass
    model._default_manager.filter(**key).update(**increments)


def context_call_record(
    *, tenant_id: Any, milliseconds: float, degradation_codes: Iterable[str], at: datetime | None = None
) -> None:
    """Count one finished context call in its tenant's hour: one UPDATE once the hour's row exists, and one
    more per degradation code the call reported. Statistics never fail the call they describe: a database
    error here is logged and the call answers as usual."""
    hour = (at or timezone.now()).replace(minute=0, second=0, microsecond=0)
    ms = round(max(milliseconds, 0.0), 3)
    bucket = latency_bucket_field(ms)
    try:
        with transaction.atomic():
            _bump(
                ContextCallHour,
                {"tenant_id": tenant_id, "hour": hour},
                {
                    "calls": F("calls") + 1,
                    bucket: F(bucket) + 1,
                    "latency_ms_sum": F("latency_ms_sum") + ms,
                    "latency_ms_max": Greatest(F("latency_ms_max"), Value(ms, output_field=FloatField())),
                },
                {"calls": 1, bucket: 1, "latency_ms_sum": ms, "latency_ms_max": ms},
            )
            for code in sorted(set(degradation_codes)):
                _bump(
                    DegradationHour,
                    {"tenant_id": tenant_id, "hour": hour, "code": code[:64]},
                    {"count": F("count") + 1},
                    {"count": 1},
                )
    except DatabaseError:
        logger.warning("context call statistics not recorded for tenant %s", tenant_id, exc_info=True)


def context_stats_prune(*, now: datetime | None = None, days: int = CONTEXT_STATS_DAYS) -> int:
    """Delete context-call rollups older than `days`; returns the rows deleted."""
    cutoff = (now or timezone.now()) - timedelta(days=days)
    calls, _ = ContextCallHour.objects.filter(hour__lt=cutoff).delete()
    degradations, _ = DegradationHour.objects.filter(hour__lt=cutoff).delete()
    return calls + degradations
