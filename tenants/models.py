"""Tenant, EndUser, ApiKey, Membership, and LlmUsage (the ledger of the monthly budget for background LLM
work)."""

import hashlib
import secrets
import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

API_KEY_PREFIX = "mnemo"
# "mnemo_" + 8 lookup chars + "_" + 40 secret chars. The lookup part is stored in clear so a key can be
# found with an index; only the sha256 of the whole key is stored.
_LOOKUP_LEN = 8
_SECRET_BYTES = 30


class Tenant(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    settings = models.JSONField(
        default=dict, blank=True, help_text="Per-tenant knobs (default model, budgets, …)."
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


# The longest end user id (the column): also the limit of the API fields that name an end user.
EXTERNAL_ID_MAX_LENGTH = 255


class EndUser(models.Model):
    """A user of the client app, known to us only by the app's own identifier."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="end_users")
    external_id = models.CharField(max_length=EXTERNAL_ID_MAX_LENGTH)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "external_id"], name="enduser_unique_per_tenant"),
        ]

    def __str__(self) -> str:
        return self.external_id


def hash_api_key(raw_key: str) -> str:
    # Keys carry 240 random bits, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(raw_key.encode()).hexdigest()


def split_api_key(raw_key: str) -> str | None:
    """The lookup part of a well-formed key, or None."""
    parts = raw_key.split("_")
    if len(parts) != 3 or parts[0] != API_KEY_PREFIX or len(parts[1]) != _LOOKUP_LEN:
        return None
    return parts[1]


class ApiKeyQuerySet(models.QuerySet):
    def active(self) -> "ApiKeyQuerySet":
        return self.filter(revoked_at__isnull=True)


class ApiKey(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, default="default")
    prefix = models.CharField(max_length=_LOOKUP_LEN, unique=True, editable=False)
    hashed_key = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{API_KEY_PREFIX}_{self.prefix}_… ({self.name})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @staticmethod
    def generate() -> tuple[str, str]:
        """A new (raw key, lookup prefix). The raw key is returned to the caller once and never stored."""
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        lookup = "".join(secrets.choice(alphabet) for _ in range(_LOOKUP_LEN))
        secret = secrets.token_urlsafe(_SECRET_BYTES).replace("_", "x").replace("-", "y")
        return f"{API_KEY_PREFIX}_{lookup}_{secret}", lookup


class Membership(models.Model):
    class Role(models.TextChoices):
        OPERATOR = "operator", "Operator"
        SUPPORT = "support", "Support"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_per_tenant"),
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"


class LlmUsage(models.Model):
    """Tokens a tenant's background LLM work (summaries, the memory agent: `purpose`) used in one calendar
    month (UTC), counted from the provider's usage in each response (or our own count when a response has
    none). The ledger of the monthly budget in the tenant's settings (tenants.llm_budget)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="llm_usage")
    month = models.DateField(help_text="First day of the month.")
    purpose = models.CharField(max_length=32, default="summary")
    calls = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    # Background work that ran offline because this month's budget was spent.
    budget_fallbacks = models.PositiveIntegerField(default=0)

    class Meta:
        # The table keeps the name it had when summaries held the ledger (migrations only moved the model).
        db_table = "summaries_llmusage"
        verbose_name = "LLM usage"
        verbose_name_plural = "LLM usage"
        ordering = ["-month", "tenant"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "month", "purpose"], name="llmusage_unique_month"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant} {self.month:%Y-%m} {self.purpose}"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
