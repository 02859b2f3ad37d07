"""Celery tasks of knowledge and the requests that queue them. They take ids and return quietly when the row
is gone; the work they run lives in knowledge.processing and knowledge.vision."""

import functools
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from cold_storage.models import ArchivedImage
from knowledge.models import Document
from knowledge.processing import document_process
from knowledge.vision import description_keys, image_describe
from providers.background import task_send
from tenants.models import Tenant

# A pending document older than its task's hard time limit (and a margin) has no live task left.
PENDING_RETRY_MARGIN_SECONDS = 100
PENDING_SWEEP_LIMIT = 500


@shared_task(acks_late=True, soft_time_limit=1800, time_limit=1900)
def document_process_task(document_id: str) -> str | None:
    """Chunk, count and embed a pending document (idempotent: a processed one is left alone)."""
    document = document_process(document_id=document_id)
    return document.status if document is not None else None


def document_process_request(*, document_id: Any) -> None:
    task_send(document_process_task, str(document_id))


@shared_task(acks_late=True)
def documents_pending_sweep() -> int:
    """Beat: queue again documents still pending after their task's hard time limit (a task the broker never
    took, or one lost with a stopped server's in-process queue). Processing twice is harmless: the second
    finish finds the document no longer pending. Returns how many were queued."""
    limit = document_process_task.time_limit or 0
    cutoff = timezone.now() - timedelta(seconds=limit + PENDING_RETRY_MARGIN_SECONDS)
    pending = (
        Document.objects.filter(status=Document.Status.PENDING, created_at__lt=cutoff)
        .order_by("created_at")
        .values_list("pk", flat=True)[:PENDING_SWEEP_LIMIT]
    )
    return sum(task_send(document_process_task, str(pk)) for pk in pending)


@shared_task(acks_late=True, soft_time_limit=300, time_limit=330)
def image_describe_task(image_id: str) -> bool:
    """Describe one stored image with the tenant's vision model, once per sha256 (a no-op when described,
    gone, or no vision model is configured). Returns whether a description exists now."""
    return image_describe(image_id=image_id) is not None


def image_description_request(*, image_id: str) -> None:
    task_send(image_describe_task, image_id)


def image_descriptions_request(*, tenant: Tenant, images: list[ArchivedImage]) -> int:
    """Queue (on commit) the images that lack a description and did not fail lately. Returns how many."""
    due = [image for image in images if cache.get(description_keys(image)[1]) is None]
    for image in due:
        transaction.on_commit(functools.partial(image_description_request, image_id=image.id))
    return len(due)
