"""Memory of an end user and of a conversation: core memory blocks (B2a) with their versions, the per-
conversation snapshot that keeps B2a stable between compaction boundaries, task state with its events (B3 and
the session profile B2b), archival memories, and the log of every memory operation."""

import uuid

from django.db import models
from django.utils import timezone

from conversations.models import Conversation
from tenants.models import EndUser, Tenant

# Rendered first, in this order; custom labels follow alphabetically. `instructions` holds the user's standing
# instructions, verbatim, written by the memory agent's rules (memory.agent.standing.STANDING_PATTERNS).
STANDARD_LABELS = ("persona", "preferences", "instructions", "profile")
DEFAULT_CHAR_LIMIT = 2000


class Actor(models.TextChoices):
    AGENT = "agent", "Memory agent"
    API = "api", "API"
    ADMIN = "admin", "Admin"


class CoreMemoryBlock(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    end_user = models.ForeignKey(EndUser, on_delete=models.CASCADE, related_name="memory_blocks")
    label = models.SlugField(max_length=64)
    value = models.TextField(blank=True, default="")
    char_limit = models.PositiveIntegerField(default=DEFAULT_CHAR_LIMIT)
    version = models.PositiveIntegerField(default=1)
    updated_by = models.CharField(max_length=150, blank=True, default="")
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["end_user", "label"], name="core_memory_label_unique_per_user")
        ]
        ordering = ["end_user_id", "label"]

    def __str__(self) -> str:
        return f"{self.label} v{self.version}"


class CoreMemoryBlockVersion(models.Model):
    """Every version a block has had: B2a renders the versions of the conversation's snapshot."""

    block = models.ForeignKey(CoreMemoryBlock, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    value = models.TextField(blank=True, default="")
    char_limit = models.PositiveIntegerField()
    updated_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["block", "version"], name="core_memory_version_unique")
        ]
        ordering = ["block_id", "version"]

    def __str__(self) -> str:
        return f"v{self.version}"


class CoreMemorySnapshot(models.Model):
    """The block versions B2a shows in this conversation's system message: taken at the first context
    call and advanced only at a compaction boundary, so core-memory edits never break the prefix cache
    mid-stretch (they reach the model as memory updates in the current user message until then)."""

    conversation = models.OneToOneField(
        Conversation, on_delete=models.CASCADE, related_name="core_memory_snapshot"
    )
    versions = models.JSONField(default=dict)  # label -> version
    boundary_seq = models.IntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"B2a snapshot at seq {self.boundary_seq}"


class MemoryOperation(models.Model):
    class Op(models.TextChoices):
        CORE_CREATE = "core_memory_create", "Core memory created"
        CORE_UPDATE = "core_memory_update", "Core memory updated"
        CORE_APPEND = "core_memory_append", "Core memory appended"
        CORE_DELETE = "core_memory_delete", "Core memory deleted"
        CORE_REVERT = "core_memory_revert", "Core memory reverted"
        ARCHIVAL_INSERT = "archival_memory_insert", "Archival memory inserted"
        ARCHIVAL_MERGE = "archival_memory_merge", "Archival memory merged"
        ARCHIVAL_UPDATE = "archival_memory_update", "Archival memory updated"
        ARCHIVAL_INVALIDATE = "archival_memory_invalidate", "Archival memory invalidated"
        ARCHIVAL_DELETE = "archival_memory_delete", "Archival memory deleted"
        ARCHIVAL_REVERT = "archival_memory_revert", "Archival memory reverted"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    end_user = models.ForeignKey(EndUser, on_delete=models.CASCADE, related_name="memory_operations")
    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    op = models.CharField(max_length=32, choices=Op.choices)
    target = models.CharField(max_length=200, help_text="core:<label> or archival:<id>")
    old_value = models.TextField(blank=True, default="")
    new_value = models.TextField(blank=True, default="")
    trigger = models.TextField(
        blank=True, default="", help_text="why: the reason given or the rule that fired"
    )
    # What the values alone do not hold: a deleted archival memory's kind, subject, importance and sources,
    # so that reverting the delete restores it whole.
    details = models.JSONField(default=dict, blank=True)
    actor = models.CharField(max_length=8, choices=Actor.choices)
    actor_name = models.CharField(max_length=150, blank=True, default="")
    reverted_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["end_user", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.op} {self.target}"


class TaskState(models.Model):
    """The folded base of a conversation's task state. `epoch` counts the accepted events (each one advances
    it, so two writers that read the same epoch cannot both append); `base_epoch` is the last event folded
    into `state`. Events after it are applied on read."""

    conversation = models.OneToOneField(Conversation, on_delete=models.CASCADE, related_name="task_state")
    state = models.JSONField(default=dict)
    epoch = models.PositiveIntegerField(default=0)
    base_epoch = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"task state (epoch {self.epoch}, base {self.base_epoch})"


class StateEvent(models.Model):
    class Type(models.TextChoices):
        SET = "set", "Set a value at a path"
        MERGE = "merge", "Merge an object into the object at a path"
        DELETE = "delete", "Delete the value at a path"
        APPEND = "append", "Append to the list at a path"

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="state_events")
    epoch = models.PositiveIntegerField()  # the epoch this event produced: the one it was appended at + 1
    event_type = models.CharField(max_length=8, choices=Type.choices)
    payload = models.JSONField(default=dict)
    request_id = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["conversation", "request_id"], name="state_event_request_unique"),
            # One event per epoch, whatever the locking: a second writer at the same epoch cannot commit.
            models.UniqueConstraint(fields=["conversation", "epoch"], name="state_event_epoch_unique"),
        ]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.event_type} @{self.epoch} ({self.request_id})"


class ArchivalMemory(models.Model):
    class Kind(models.TextChoices):
        PREFERENCE = "preference", "Preference"
        DECISION = "decision", "Decision"
        CONTEXT = "context", "Context"
        OUTCOME = "outcome", "Outcome"
        FACT = "fact", "Fact"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    end_user = models.ForeignKey(EndUser, on_delete=models.CASCADE, related_name="archival_memories")
    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    content = models.TextField()
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.FACT)
    # A fact about the same subject key replaces (invalidates) the older one, e.g. "favourite_colour".
    subject = models.CharField(max_length=200, blank=True, default="")
    importance = models.FloatField(default=0.5)
    embedding = models.BinaryField(null=True, blank=True, editable=False)  # float32 bytes, L2-normalised
    embedding_model = models.CharField(max_length=100, blank=True, default="")
    source_message_ids = models.JSONField(default=list, blank=True)
    mentions = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    invalidated_at = models.DateTimeField(null=True, blank=True)
    invalidated_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["end_user", "invalidated_at"])]

    def __str__(self) -> str:
        return self.content[:60]


class MemoryAgentCursor(models.Model):
    """How far the memory agent has read a conversation: messages up to last_seq are processed."""

    conversation = models.OneToOneField(
        Conversation, on_delete=models.CASCADE, related_name="memory_agent_cursor"
    )
    last_seq = models.IntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"memory agent at seq {self.last_seq}"
