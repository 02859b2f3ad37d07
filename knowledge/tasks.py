"""Celery tasks of knowledge. They take ids, import their service inside the function and return quietly
when the row is gone."""

from celery import shared_task


@shared_task(acks_late=True, soft_time_limit=1800, time_limit=1900)
def document_process_task(document_id: str) -> str | None:
    """Chunk, count and embed a pending document (idempotent: a processed one is left alone)."""
    from knowledge.services import document_process

    document = document_process(document_id=document_id)
    return document.status if document is not None else None
