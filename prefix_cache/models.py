"""PrefixHint (which prompt prefixes a tenant has sent, per layout level), CacheUsage (predicted vs
actual cached tokens, one row per context call, completed when the provider's usage comes back), and the
hourly rollups of context calls (latency, degradations) the dashboard draws."""

import uuid

from django.db import models
from django.utils import timezone

from conversations.models import Conversation
from tenants.models import Tenant


class PrefixHint(models.Model):
    class Level(models.TextChoices):
        B1 = "B1", "B1 agent profile"
        B2A = "B1+B2a", "+ core memory"
        B4 = "B1+B2a+B4", "+ summaries (whole system message)"
        B6 = "B1+B2a+B4+B6", "+ history"
        PROMPT = "prompt", "+ current message (the whole prompt)"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="prefix_hints")
    level = models.CharField(max_length=16, choices=Level.choices)
    hash = models.CharField(max_length=64)
    token_count = models.PositiveIntegerField()
    hits = models.PositiveIntegerField(default=1)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "level", "hash"], name="prefixhint_unique")]
        indexes = [models.Index(fields=["tenant", "-last_seen"], name="prefixhint_recent")]

    def __str__(self) -> str:
        return f"{self.level} {self.hash[:12]} ({self.hits} hits)"


class CacheUsage(models.Model):
    class Provider(models.TextChoices):
        OPENAI = "openai", "OpenAI"
        ANTHROPIC = "anthropic", "Anthropic"
        GEMINI = "gemini", "Gemini"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="cache_usage")
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="cache_usage")
    provider = models.CharField(max_length=16, choices=Provider.choices)
    model = models.CharField(max_length=100)
    # Filled from the provider's usage object; null until it arrives.
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    cache_write_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    # What Mnemo predicted when it assembled the prompt.
    predicted_prompt_tokens = models.PositiveIntegerField(default=0)
    predicted_cacheable_tokens = models.PositiveIntegerField(default=0)
    prefix_hash = models.CharField(max_length=64, blank=True)
    hint_level = models.CharField(max_length=16, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    reported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "cache usage"
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="cacheusage_recent"),
            models.Index(fields=["conversation", "-created_at"], name="cacheusage_conversation"),
        ]

    def __str__(self) -> str:
        return f"{self.model} {self.cached_tokens}/{self.prompt_tokens}"


# Upper edges (milliseconds) of the context-call latency histogram; a call over the last edge counts in
# `ms_over`. Percentiles are read from it by interpolating inside a bucket (selectors.latency_percentile).
LATENCY_EDGES_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


def latency_bucket_field(milliseconds: float) -> str:
    """The histogram column a call of this duration counts in."""
    edge = next((e for e in LATENCY_EDGES_MS if milliseconds <= e), None)
    return f"ms_le_{edge}" if edge is not None else "ms_over"


class ContextCallHour(models.Model):
    """A tenant's context calls in one hour: how many, and how long they took as a fixed histogram, from
    which the dashboard reads p50 and p95. One row per tenant and hour, bumped by each call with F()."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="context_call_hours")
    hour = models.DateTimeField(help_text="Start of the hour (UTC).")
    calls = models.PositiveIntegerField(default=0)
    latency_ms_sum = models.FloatField(default=0)
    latency_ms_max = models.FloatField(default=0)
    ms_le_1 = models.PositiveIntegerField(default=0)
    ms_le_2 = models.PositiveIntegerField(default=0)
    ms_le_5 = models.PositiveIntegerField(default=0)
    ms_le_10 = models.PositiveIntegerField(default=0)
    ms_le_20 = models.PositiveIntegerField(default=0)
    ms_le_50 = models.PositiveIntegerField(default=0)
    ms_le_100 = models.PositiveIntegerField(default=0)
    ms_le_200 = models.PositiveIntegerField(default=0)
    ms_le_500 = models.PositiveIntegerField(default=0)
    ms_le_1000 = models.PositiveIntegerField(default=0)
    ms_le_2000 = models.PositiveIntegerField(default=0)
    ms_le_5000 = models.PositiveIntegerField(default=0)
    ms_le_10000 = models.PositiveIntegerField(default=0)
    ms_over = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "hour"], name="contextcallhour_unique")]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}:00 {self.calls} calls"


class DegradationHour(models.Model):
    """How many of a tenant's context calls in one hour took a fallback, by degradation code (a call counts
    once per code it reported)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="degradation_hours")
    hour = models.DateTimeField(help_text="Start of the hour (UTC).")
    code = models.CharField(max_length=64)
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "hour", "code"], name="degradationhour_unique")
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}:00 {self.code} x{self.count}"
