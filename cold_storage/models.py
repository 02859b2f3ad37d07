"""ArchivedImage: one image a message carried. The bytes live in a storage backend (hot or cold tier), never
in the database. cold_storage sits below conversations, so the conversation, turn and message it belongs to
are plain indexed UUID columns, not foreign keys."""

import secrets

from django.db import models
from django.db.models import Q
from django.utils import timezone

from tenants.models import Tenant


def new_image_id() -> str:
    # 24 decimal digits: 80 random bits, global and unguessable, and cheap for the model to read: tiktoken's
    # encodings cut digits into groups of three, so the id is 8 tokens and a placeholder naming it 17 (16
    # base32 characters cost 18.3 on average; a compacted session carries a placeholder per hidden frame).
    return f"img_{secrets.randbelow(10**24):024d}"


class ArchivedImage(models.Model):
    class Tier(models.TextChoices):
        HOT = "hot", "Hot"
        COLD = "cold", "Cold"

    class Role(models.TextChoices):
        ANCHOR = "anchor", "Anchor (first of its turn)"
        PROCESS = "process", "Process"
        RESULT = "result", "Result (last of its turn)"
        ERROR = "error", "Error frame"

    id = models.CharField(primary_key=True, max_length=40, default=new_image_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="images")
    conversation_id = models.UUIDField(db_index=True)
    turn_id = models.UUIDField(null=True, blank=True, db_index=True)
    message_id = models.UUIDField(null=True, blank=True, db_index=True)
    # Position in the conversation (message seq, then the part's place in the message): "the previous image"
    # for dedup is the highest position before this one.
    message_seq = models.PositiveBigIntegerField(default=0)
    part_index = models.PositiveIntegerField(default=0)
    sha256 = models.CharField(max_length=64)
    phash = models.CharField(max_length=16)
    dhash = models.CharField(max_length=16)
    ahash = models.CharField(max_length=16)
    grid = models.BinaryField(
        max_length=1024, default=bytes, blank=True, help_text="32×32 mean brightness (cold_storage.imaging)."
    )
    width = models.PositiveIntegerField()
    height = models.PositiveIntegerField()
    format = models.CharField(max_length=8)
    media_type = models.CharField(max_length=32)
    size = models.PositiveIntegerField(help_text="Bytes of this image as received.")
    # Empty for a duplicate (its bytes are the original's) and after a purge.
    storage_key = models.CharField(max_length=300, blank=True)
    tier = models.CharField(max_length=8, choices=Tier.choices, default=Tier.HOT)
    role = models.CharField(max_length=8, choices=Role.choices, default=Role.PROCESS)
    duplicate_of = models.ForeignKey(
        "self", on_delete=models.CASCADE, null=True, blank=True, related_name="duplicates"
    )
    hamming_distance = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Distance to the image it duplicates, in the tenant's hash."
    )
    pinned = models.BooleanField(default=False, help_text="Never purged by retention.")
    compacted_at = models.DateTimeField(
        null=True, blank=True, help_text="When visual compaction replaced it by a placeholder."
    )
    purged_at = models.DateTimeField(null=True, blank=True, help_text="When retention deleted its bytes.")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_accessed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["conversation_id", "message_seq", "part_index"], name="image_conv_position"),
            models.Index(
                fields=["tenant", "created_at"],
                condition=Q(tier="cold", pinned=False, purged_at__isnull=True),
                name="image_retention_candidates",
            ),
        ]

    def __str__(self) -> str:
        return self.id

    def hash_value(self, algorithm: str) -> str:
        return {"phash": self.phash, "dhash": self.dhash, "ahash": self.ahash}[algorithm]

    @property
    def root_id(self) -> str:
        """The image whose bytes this one shows."""
        return self.duplicate_of_id or self.id
