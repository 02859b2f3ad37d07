"""A deleted document's bytes leave storage when the deleting transaction commits, whatever deleted it
(the API, the admin, or its conversation, end user or tenant going)."""

import logging
from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver

from knowledge.models import Document
from knowledge.storage import document_storage

logger = logging.getLogger(__name__)


@receiver(post_delete, sender=Document, dispatch_uid="knowledge_document_bytes")
def document_bytes_delete(sender: Any, instance: Document, **kwargs: Any) -> None:
    key = instance.storage_key
    if not key:
        return

    def remove() -> None:
        try:
            document_storage().delete(key)
        except OSError:
            logger.exception("could not delete document bytes %s", key)

    transaction.on_commit(remove)
