"""The per-tenant monthly token budget for background LLM work (summaries, the memory agent), counted from
the provider's responses. When it is spent, background work runs offline and says so (degradation
`llm_budget_spent`). It lives with the tenant because every app that spends may import tenants."""

import datetime

from django.db import IntegrityError, transaction
from django.db.models import F, Sum
from django.utils import timezone

from providers.llm import LLMReply
from tenants.models import LlmUsage, Tenant


def current_month(now: datetime.datetime | None = None) -> datetime.date:
    now = now or timezone.now()
    return now.astimezone(datetime.UTC).date().replace(day=1)


def llm_tokens_used(*, tenant: Tenant, month: datetime.date | None = None) -> int:
    totals = LlmUsage.objects.filter(tenant=tenant, month=month or current_month()).aggregate(
        prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens")
    )
    return (totals["prompt"] or 0) + (totals["completion"] or 0)


def llm_budget_left(*, tenant: Tenant, monthly_tokens: int) -> int:
    """Tokens left this month (0 when spent; a budget of 0 allows no background LLM use)."""
    return max(0, monthly_tokens - llm_tokens_used(tenant=tenant))


def _row(tenant: Tenant, purpose: str) -> LlmUsage:
    month = current_month()
    try:
        with transaction.atomic():
            row, _ = LlmUsage.objects.get_or_create(tenant=tenant, month=month, purpose=purpose)
    except IntegrityError:  # another worker created it between our get and create
        row = LlmUsage.objects.get(tenant=tenant, month=month, purpose=purpose)
    return row


def llm_usage_record(*, tenant: Tenant, reply: LLMReply, purpose: str = "summary") -> None:
    """Add one reply's tokens. An atomic F() update, so concurrent workers never lose a count."""
    row = _row(tenant, purpose)
    LlmUsage.objects.filter(pk=row.pk).update(
        calls=F("calls") + 1,
        prompt_tokens=F("prompt_tokens") + reply.prompt_tokens,
        completion_tokens=F("completion_tokens") + reply.completion_tokens,
    )


def llm_budget_fallback_record(*, tenant: Tenant, purpose: str = "summary") -> None:
    row = _row(tenant, purpose)
    LlmUsage.objects.filter(pk=row.pk).update(budget_fallbacks=F("budget_fallbacks") + 1)
