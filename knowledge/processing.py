"""Processing one pending document: its bytes read, chunked, counted and embedded, and chunks, token counts
and vectors written in one transaction with its status (ready, or failed with a reason)."""

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from knowledge.chunking import Draft
from knowledge.conf import knowledge_limits
from knowledge.events import document_event
from knowledge.extract import ExtractionError
from knowledge.identifiers import identifier_words, symbol_words
from knowledge.ingest import ingest
from knowledge.models import Chunk, Document
from knowledge.storage import document_storage
from knowledge.vectors import draft_vectors

logger = logging.getLogger(__name__)


def document_read(document: Document) -> bytes:
    with document_storage().open(document.storage_key, "rb") as handle:
        return handle.read()


def document_process(*, document_id: Any) -> Document | None:
    """Turn a pending document into chunks (ready) or a reason (failed). Idempotent: a document that is no
    longer pending, or gone, is left as it is."""
    document = Document.objects.select_related("tenant").filter(pk=document_id).first()
    if document is None or document.status != Document.Status.PENDING:
        return document
    limits = knowledge_limits(document.tenant.settings)
    try:
        ingested = ingest(
            name=document.name, format_name=document.format, data=document_read(document), limits=limits
        )
    except ExtractionError as exc:
        return _finish(document, error=(exc.code, exc.message))
    except Exception as exc:  # a reader's bug must fail the document, not leave it pending forever
        logger.exception("processing document %s failed", document.pk)
        return _finish(
            document, error=("processing_error", f"The file could not be processed ({type(exc).__name__}).")
        )
    vectors, model = draft_vectors(ingested.drafts)
    chunks = [
        _chunk(document, i, d, vectors[i] if vectors else None, model) for i, d in enumerate(ingested.drafts)
    ]
    return _finish(document, chunks=chunks, details=ingested.details)


def _chunk(document: Document, ordinal: int, draft: Draft, vector: bytes | None, model: str) -> Chunk:
    return Chunk(
        document_id=document.pk,
        tenant_id=document.tenant_id,
        scope_key=document.scope_key,
        kind=document.kind,
        ordinal=ordinal,
        language=draft.language[:32],
        path=draft.path[:500],
        symbol=draft.symbol[:300],
        symbol_words=symbol_words(draft.symbol)[:600],
        start_line=draft.start_line,
        end_line=draft.end_line,
        page=draft.page,
        heading=draft.heading[:500],
        sheet=draft.sheet[:100],
        cell_range=draft.cell_range[:40],
        identifiers=identifier_words(draft.content),
        content=draft.content,
        token_count=draft.tokens,
        embedding=vector,
        embedding_model=model if vector is not None else "",
    )


def _finish(
    document: Document,
    *,
    chunks: list[Chunk] | None = None,
    details: dict[str, Any] | None = None,
    error: tuple[str, str] | None = None,
) -> Document | None:
    """Write the outcome, chunks and status in one transaction, if the document is still pending."""
    with transaction.atomic():
        locked = (
            Document.objects.select_for_update()
            .filter(pk=document.pk, status=Document.Status.PENDING)
            .first()
        )
        if locked is None:
            return None
        if error is not None:
            locked.status, (locked.error_code, locked.error) = Document.Status.FAILED, error
        else:
            Chunk.objects.bulk_create(chunks or [], batch_size=500)
            locked.status = Document.Status.READY
            locked.chunk_count = len(chunks or [])
            locked.token_count = sum(c.token_count for c in chunks or [])
            locked.details = details or {}
        locked.processed_at = timezone.now()
        locked.save(
            update_fields=[
                "status",
                "error_code",
                "error",
                "chunk_count",
                "token_count",
                "details",
                "processed_at",
            ]
        )
        document_event(locked)
    return locked
