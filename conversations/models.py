"""Conversation, Turn and Message. Raw messages are never deleted by compaction; only an explicit purge
removes them."""

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from tenants.models import EndUser, Tenant


class Conversation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="conversations")
    end_user = models.ForeignKey(
        EndUser, on_delete=models.CASCADE, null=True, blank=True, related_name="conversations"
    )
    model = models.CharField(max_length=100, help_text="Model the client sends this conversation to.")
    title = models.CharField(max_length=300, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # Counters advanced only under the conversation's row lock: the next seq and turn index come from here.
    last_seq = models.PositiveBigIntegerField(default=0, editable=False)
    last_turn_index = models.PositiveIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now, editable=False)
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "-created_at", "-id"], name="conv_tenant_created"),
            models.Index(fields=["end_user", "-created_at"], name="conv_enduser_created"),
        ]

    def __str__(self) -> str:
        return self.title or str(self.id)


class Turn(models.Model):
    """One user request and everything the agent did for it."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        ENDED = "ended", "Ended"
        COMPACTED = "compacted", "Compacted"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="turns")
    index = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # By the column, not the relation: ordering by "conversation" would join it and sort by its ordering.
        ordering = ["conversation_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "index"], name="turn_index_unique"),
            models.UniqueConstraint(
                fields=["conversation"], condition=Q(status="active"), name="turn_one_active_per_conversation"
            ),
        ]

    def __str__(self) -> str:
        return f"turn {self.index} ({self.status})"


class Message(models.Model):
    class Role(models.TextChoices):
        SYSTEM = "system", "System"
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"
        TOOL = "tool", "Tool"

    class Kind(models.TextChoices):
        MESSAGE = "message", "Message"
        COMPACT_BOUNDARY = "compact_boundary", "Compaction boundary"
        COMPACT_SUMMARY = "compact_summary", "Compaction summary"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    seq = models.PositiveBigIntegerField(help_text="Canonical order and cursor, strictly increasing.")
    turn = models.ForeignKey(Turn, on_delete=models.SET_NULL, null=True, blank=True, related_name="messages")
    role = models.CharField(max_length=16, choices=Role.choices)
    # The speaker (OpenAI's message `name`): who said it when several people or agents share a role. "" when
    # the client gave none; every block that shows the message shows it, and retrieval indexes it.
    name = models.CharField(max_length=64, blank=True, default="")
    kind = models.CharField(max_length=24, choices=Kind.choices, default=Kind.MESSAGE)
    content = models.TextField(blank=True)
    parts = models.JSONField(default=list, blank=True)
    # Counted once on write with the conversation's model; the read path never re-tokenises history.
    token_count = models.PositiveIntegerField(default=0)
    completed = models.BooleanField(default=True, help_text="False for a streamed reply that was cut off.")
    is_error = models.BooleanField(default=False)
    # NULL, not "", means "no key": the conditional unique constraint must ignore keyless messages.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    # DO_NOTHING: messages are only ever deleted a whole conversation at a time, and this keeps that one
    # DELETE statement instead of a row-by-row collection.
    parent = models.ForeignKey("self", on_delete=models.DO_NOTHING, null=True, blank=True, related_name="+")
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["conversation_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "seq"], name="message_seq_unique"),
            models.UniqueConstraint(
                fields=["conversation", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="message_idempotency_key_unique",
            ),
        ]
        indexes = [
            # The context pipeline looks up the last compaction boundary on every call; without this it
            # would scan a conversation's whole history when there is none.
            models.Index(
                fields=["conversation", "seq"],
                condition=Q(kind="compact_boundary"),
                name="message_boundary_seq",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.role}"


class MessageVector(models.Model):
    """The retrieval vectors of one message: one per passage (providers.passages), float32 rows of
    `dimension` values in one blob, written in the background after the message (conversations.embedding).
    Deleted with the message, so a purged conversation or end user leaves no vectors behind."""

    message = models.OneToOneField(Message, on_delete=models.CASCADE, primary_key=True, related_name="vector")
    # Copied from the message so a conversation's vectors are read by one index range.
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="+")
    seq = models.PositiveBigIntegerField()
    model = models.CharField(max_length=100, help_text="The embedding model that made the vectors.")
    dimension = models.PositiveSmallIntegerField()
    spans = models.JSONField(default=list, help_text="[start, end] of each passage in the content.")
    vectors = models.BinaryField()
    # sha256 of model and content: an identical text of the same tenant re-uses its vectors.
    content_sha256 = models.CharField(max_length=64, db_index=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["conversation", "seq"], name="message_vector_conv_seq")]

    def __str__(self) -> str:
        return f"vectors of #{self.seq} ({self.model})"
