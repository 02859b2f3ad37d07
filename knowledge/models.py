"""Document and Chunk: what a tenant uploads for retrieval (documents and code) and the pieces search
finds. A document's bytes live in a storage backend (knowledge.storage), never in the database; its chunks
carry their provenance (page, heading, sheet and cells, path, symbol and lines), a token count taken once on
write and the vector of the local embedding model."""

import uuid
from typing import Any

from django.db import models
from django.utils import timezone

from conversations.models import Conversation
from tenants.models import EndUser, Tenant


def scope_key(*, end_user_id: Any = None, conversation: Any = None) -> str:
    """Document.scope_key of a scope: a conversation, else an end user, else the whole tenant."""
    if conversation is not None:
        return f"c{conversation.pk.hex}"
    return f"u{end_user_id}" if end_user_id is not None else "tenant"


class Document(models.Model):
    class Kind(models.TextChoices):
        DOCUMENT = "document", "Document"
        CODE = "code", "Code"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    class Scope(models.TextChoices):
        TENANT = "tenant", "Tenant-wide"
        END_USER = "end_user", "End user"
        CONVERSATION = "conversation", "Conversation"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="documents")
    end_user = models.ForeignKey(
        EndUser, on_delete=models.CASCADE, null=True, blank=True, related_name="documents"
    )
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, null=True, blank=True, related_name="documents"
    )
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.TENANT)
    # "tenant", "u<end user id>" or "c<conversation id>": the one column dedup and search filter on.
    scope_key = models.CharField(max_length=48, editable=False)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.DOCUMENT)
    name = models.CharField(max_length=255)
    format = models.CharField(max_length=16, help_text="pdf, docx, xlsx, pptx, markdown, html, text, csv…")
    size = models.PositiveBigIntegerField(help_text="Bytes as uploaded.")
    sha256 = models.CharField(max_length=64)
    storage_key = models.CharField(max_length=300, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    error_code = models.CharField(max_length=64, blank=True)
    error = models.TextField(blank=True)
    details = models.JSONField(
        default=dict, blank=True, help_text="Pages, files indexed and skipped (with reasons)."
    )
    chunk_count = models.PositiveIntegerField(default=0)
    token_count = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "scope_key", "sha256"], name="document_sha256_per_scope"
            )
        ]
        indexes = [
            models.Index(fields=["tenant", "-created_at", "-id"], name="document_tenant_created"),
            models.Index(fields=["tenant", "status"], name="document_tenant_status"),
        ]

    def __str__(self) -> str:
        return self.name


class Chunk(models.Model):
    """One retrievable piece: a stretch of a document under one heading/page/sheet, or one function, method
    or class of a code file (or a window of lines)."""

    id = models.BigAutoField(primary_key=True)
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    # Copied from the document so search filters without a join.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    scope_key = models.CharField(max_length=48)
    kind = models.CharField(max_length=16, choices=Document.Kind.choices)
    ordinal = models.PositiveIntegerField()
    language = models.CharField(max_length=32, blank=True)
    path = models.CharField(max_length=500, blank=True, help_text="File inside an archive, or the name.")
    symbol = models.CharField(max_length=300, blank=True, help_text="Qualified function/method/class name.")
    symbol_words = models.CharField(
        max_length=600, blank=True, help_text="The symbol split into lower-case words (trigram matching)."
    )
    start_line = models.PositiveIntegerField(null=True, blank=True)
    end_line = models.PositiveIntegerField(null=True, blank=True)
    page = models.PositiveIntegerField(null=True, blank=True, help_text="PDF page or slide number.")
    heading = models.CharField(max_length=500, blank=True)
    sheet = models.CharField(max_length=100, blank=True)
    cell_range = models.CharField(max_length=40, blank=True)
    identifiers = models.TextField(blank=True, help_text="Identifier words (split camelCase/snake_case).")
    content = models.TextField()
    token_count = models.PositiveIntegerField()
    embedding_model = models.CharField(max_length=100, blank=True)
    embedding = models.BinaryField(null=True, blank=True, help_text="float32, L2-normalised.")

    class Meta:
        ordering = ["document_id", "ordinal"]
        constraints = [models.UniqueConstraint(fields=["document", "ordinal"], name="chunk_ordinal_unique")]
        indexes = [models.Index(fields=["tenant", "id"], name="chunk_tenant_id")]

    def __str__(self) -> str:
        return f"{self.document_id}#{self.ordinal}"


class ImageDescription(models.Model):
    """What a vision-capable model said an image shows, once per tenant and image bytes (sha256): a
    duplicate, a re-upload or the same screenshot in another conversation re-uses it. The attachment decay
    stage shows it in place of the pixels. Without one (no vision model, or not described yet) the image is
    described offline by its id, format, size and role (knowledge.vision.offline_description)."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    sha256 = models.CharField(max_length=64)
    text = models.TextField()
    model = models.CharField(max_length=100, help_text="The model that wrote the description.")
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "sha256"], name="image_description_per_sha256")
        ]

    def __str__(self) -> str:
        return f"description of {self.sha256[:12]}"
