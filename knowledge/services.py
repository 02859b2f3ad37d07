"""Writes of the knowledge app: uploading documents (bytes to storage, sha256 dedup per scope, processing
queued on commit), processing one (chunks, token counts and vectors written in one transaction with the
status) and deleting one (rows now, bytes on commit)."""

import hashlib
import logging
import re
import unicodedata
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from django.core.files.base import ContentFile
from django.db import IntegrityError, transaction
from rest_framework import status

from conversations.models import Conversation
from conversations.selectors import access_conversation
from knowledge.conf import KnowledgeLimits, knowledge_limits
from knowledge.events import document_event
from knowledge.extract import detect_format
from knowledge.models import Document, scope_key
from knowledge.storage import document_storage
from knowledge.tasks import document_process_request
from tenants.errors import ApplicationError
from tenants.models import EndUser, Tenant
from tenants.scoping import access_end_user
from tenants.services import end_user_get_or_create

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scope:
    end_user: EndUser | None = None
    conversation: Conversation | None = None

    @property
    def name(self) -> str:
        if self.conversation is not None:
            return Document.Scope.CONVERSATION
        return Document.Scope.END_USER if self.end_user is not None else Document.Scope.TENANT

    @property
    def key(self) -> str:
        return scope_key(end_user_id=getattr(self.end_user, "pk", None), conversation=self.conversation)


def scope_resolve(
    *, tenant: Tenant, conversation_id: Any = None, end_user: str | None = None, create: bool = True
) -> Scope:
    """The scope a request names: a conversation of the tenant (404 otherwise), an end user (for an upload
    created on first use, as conversations create theirs; for a search 404 when unknown) or, with neither,
    the whole tenant."""
    if conversation_id is not None:
        conversation = access_conversation(tenant=tenant, conversation_id=conversation_id)
        if end_user is not None and (
            conversation.end_user is None or conversation.end_user.external_id != end_user
        ):
            raise ApplicationError(
                "The conversation does not belong to this end user.", code="scope_mismatch"
            )
        return Scope(end_user=conversation.end_user, conversation=conversation)
    if end_user is not None:
        if not create:
            return Scope(end_user=access_end_user(tenant=tenant, external_id=end_user))
        return Scope(end_user=end_user_get_or_create(tenant=tenant, external_id=end_user))
    return Scope()


_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f]")


def clean_name(raw: str | None) -> str:
    """The file's own name (no folders a browser may send), printable, at most 255 characters."""
    name = PurePosixPath((raw or "").replace("\\", "/")).name
    name = _UNSAFE_NAME.sub("", unicodedata.normalize("NFC", name)).strip()
    return (name or "upload")[-255:]


def _check_batch(files: list[Any], limits: KnowledgeLimits) -> None:
    if not files:
        raise ApplicationError("Send at least one file in the field 'file'.", code="no_files")
    if len(files) > limits.max_files:
        raise ApplicationError(
            f"A request carries at most {limits.max_files} documents.",
            code="too_many_files",
            extra={"limit": limits.max_files},
        )
    for upload in files:
        if upload.size > limits.max_bytes:
            raise ApplicationError(
                f"{clean_name(upload.name)} is larger than {limits.max_bytes} bytes.",
                code="document_too_large",
                status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
                extra={"name": clean_name(upload.name), "limit_bytes": limits.max_bytes},
            )
        if upload.size == 0:
            raise ApplicationError(f"{clean_name(upload.name)} is empty.", code="empty_file")


@dataclass(frozen=True)
class Uploaded:
    document: Document
    created: bool


def documents_upload(*, tenant: Tenant, files: list[Any], scope: Scope) -> list[Uploaded]:
    """Store each file (a file already in this scope, by sha256, answers with its document) and queue its
    processing. The whole batch is checked first: a file over the limit refuses the request, nothing
    stored. A file no reader takes is stored as a failed document and the rest go on."""
    limits = knowledge_limits(tenant.settings)
    _check_batch(files, limits)
    return [_upload_one(tenant=tenant, upload=upload, scope=scope) for upload in files]


def _upload_one(*, tenant: Tenant, upload: Any, scope: Scope) -> Uploaded:
    data = upload.read()
    digest = hashlib.sha256(data).hexdigest()
    existing = Document.objects.filter(tenant=tenant, scope_key=scope.key, sha256=digest).first()
    if existing is not None:
        return Uploaded(existing, False)
    name = clean_name(upload.name)
    format_name = detect_format(name, data[:512])
    document = Document(
        tenant=tenant,
        end_user=scope.end_user,
        conversation=scope.conversation,
        scope=scope.name,
        scope_key=scope.key,
        kind=Document.Kind.CODE if format_name in ("code", "archive") else Document.Kind.DOCUMENT,
        name=name,
        format=format_name or "unknown",
        size=len(data),
        sha256=digest,
    )
    if format_name is None:
        document.status = Document.Status.FAILED
        document.error_code = "unsupported_type"
        document.error = (
            f"{name}: no reader for this type of file (PDF, DOCX, XLSX, PPTX, Markdown, HTML, text, CSV, "
            "code, or a zip or tar of them)."
        )
    # The storage key is ours (tenant/document id); only a tidy extension of the client's name goes in it.
    suffix = re.sub(r"[^a-z0-9.]", "", "".join(PurePosixPath(name.lower()).suffixes[-2:]))[:16]
    key = document_storage().save(f"{tenant.pk}/{document.id}{suffix}", ContentFile(data))
    document.storage_key = key
    try:
        with transaction.atomic():
            document.save(force_insert=True)
    except IntegrityError:  # the same bytes uploaded at the same moment: one document
        document_storage().delete(key)
        return Uploaded(Document.objects.get(tenant=tenant, scope_key=scope.key, sha256=digest), False)
    if document.status == Document.Status.PENDING:
        transaction.on_commit(lambda: document_process_request(document_id=document.pk))
    document_event(document)
    return Uploaded(document, True)


def document_delete(*, document: Document) -> None:
    """Delete the document and its chunks (and so their vectors); its bytes go when the transaction
    commits."""
    document.delete()  # knowledge.receivers removes the bytes on commit
