"""SummarySegment (the B4 pieces), the per-conversation compaction state (queue flag, lease, last outcome)
and the per-tenant monthly ledger of background LLM tokens."""

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from conversations.models import Conversation


class SummarySegment(models.Model):
    """A summary of the raw messages start_seq..end_seq. Level 0 comes from one compaction; a roll-up of
    older segments has a higher level and records whether it was made from their raw messages or, when
    those did not fit the summariser's input, from the segments. Nothing is deleted: a replaced segment
    points at its replacement (superseded_by) and leaves the prompt."""

    class Source(models.TextChoices):
        LLM = "llm", "LLM"
        EXTRACTIVE = "extractive", "Extractive (offline)"
        TRUNCATION = "truncation", "Truncation (no summary)"

    class BuiltFrom(models.TextChoices):
        RAW = "raw", "Raw messages"
        SEGMENTS = "segments", "Older segments"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="summary_segments")
    start_seq = models.PositiveBigIntegerField()
    end_seq = models.PositiveBigIntegerField()
    level = models.PositiveSmallIntegerField(default=0)
    text = models.TextField()
    token_count = models.PositiveIntegerField(
        default=0, help_text="Tokens of the text as the prompt shows it."
    )
    source = models.CharField(max_length=16, choices=Source.choices)
    built_from = models.CharField(max_length=16, choices=BuiltFrom.choices, default=BuiltFrom.RAW)
    model = models.CharField(max_length=100, blank=True, help_text="LLM model, or the extractive version.")
    template_version = models.CharField(max_length=32)
    facts_checked = models.PositiveIntegerField(default=0, help_text="Facts found in the source messages.")
    facts_missing = models.PositiveIntegerField(
        default=0, help_text="Facts the summary had lost (re-added by the fact check)."
    )
    # seq of the compact_boundary written with it, and of the compact_summary message that carries it.
    boundary_seq = models.PositiveBigIntegerField(default=0)
    summary_seq = models.PositiveBigIntegerField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    superseded_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="replaces"
    )

    class Meta:
        ordering = ["conversation", "start_seq", "level"]
        indexes = [
            # B4 is read on every context call: the live segments of one conversation, oldest first.
            models.Index(
                fields=["conversation", "start_seq"],
                condition=Q(superseded_by__isnull=True),
                name="segment_live",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(end_seq__gte=models.F("start_seq")), name="segment_range_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.start_seq}–{self.end_seq} L{self.level} ({self.source})"

    @property
    def is_live(self) -> bool:
        return self.superseded_by_id is None


class CompactionState(models.Model):
    """One row per conversation that was ever compacted or queued. `queued_at` collapses duplicate triggers
    (only the request that sets it queues a task); `lease_*` is the per-conversation lock when there is no
    Redis (an atomic conditional update, so several workers can race for it). `running_since` is committed
    before a run starts and cleared when it ends, so a run whose worker died is found (by the next run or
    the catch-up sweep) and recorded as a failure; `last_error` stays until a run succeeds."""

    conversation = models.OneToOneField(
        Conversation, on_delete=models.CASCADE, primary_key=True, related_name="compaction_state"
    )
    queued_at = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=64, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    last_end_seq = models.PositiveBigIntegerField(default=0)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_source = models.CharField(max_length=16, blank=True)
    last_error = models.TextField(blank=True)
    failures = models.PositiveIntegerField(default=0)
    compactions = models.PositiveIntegerField(default=0)
    running_since = models.DateTimeField(null=True, blank=True)
    last_failed_at = models.DateTimeField(null=True, blank=True)
    # What the latest context request that queued a compaction could give the history and the summaries
    # (sized from its token_budget). Every later run, a retry or the catch-up sweep's included, measures the
    # history against the first and rolls B4 up to fit the second, not the tenant's defaults
    # (summaries.conf.compaction_config_requested).
    history_budget = models.PositiveIntegerField(null=True, blank=True)
    summary_budget = models.PositiveIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"compaction of {self.conversation_id}"

    @property
    def status(self) -> str:
        """running, queued, failed (the last run failed; the catch-up sweep retries it) or idle."""
        if self.running_since is not None:
            return "running"
        if self.queued_at is not None:
            return "queued"
        return "failed" if self.last_error else "idle"
