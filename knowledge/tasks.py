"""Celery tasks of knowledge. They take ids, import their service inside the function and return quietly
when the row is gone."""

from celery import shared_task


@shared_task(acks_late=True, soft_time_limit=1800, time_limit=1900)
def document_process_task(document_id: str) -> str | None:
    """Chunk, count and embed a pending document (idempotent: a processed one is left alone)."""
    from knowledge.services import document_process

    document = document_process(document_id=document_id)
    return document.status if document is not None else None


# A pending document older than its task's hard time limit (and a margin) has no live task left.
PENDING_RETRY_MARGIN_SECONDS = 100
PENDING_SWEEP_LIMIT = 500


@shared_task(acks_late=True)
def documents_pending_sweep() -> int:
    """Beat: queue again documents still pending after their task's hard time limit (a task the broker never
    took, or one lost with a stopped server's in-process queue). Processing twice is harmless: the second
    finish finds the document no longer pending. Returns how many were queued."""
    from datetime import timedelta

    from django.utils import timezone

    from knowledge.models import Document
    from providers.background import task_send

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
    from knowledge.vision import image_describe

    return image_describe(image_id=image_id) is not None
