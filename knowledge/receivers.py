"""A deleted document's bytes leave storage when the deleting transaction commits, whatever deleted it
(the API, the admin, or its conversation, end user or tenant going). A newly stored image is queued for its
description once the message that carried it is committed, and a description whose image bytes no longer
exist anywhere in the tenant goes with the last of them."""

import logging
from typing import Any

from django.db import transaction
from django.db.models import Exists
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from cold_storage.models import ArchivedImage
from knowledge.models import Document, ImageDescription
from knowledge.storage import document_storage
from knowledge.tasks import image_description_request
from knowledge.vision import vision_status
from tenants.models import Tenant

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


@receiver(post_save, sender=ArchivedImage, dispatch_uid="knowledge_image_describe")
def image_describe_queue(sender: Any, instance: ArchivedImage, created: bool, **kwargs: Any) -> None:
    # A duplicate shows its original's bytes: the original's description serves it.
    if not created or instance.duplicate_of_id:
        return
    image_id, tenant_id = instance.id, instance.tenant_id

    def queue() -> None:
        # Checked after commit, so the append's own transaction gains no query.
        tenant = Tenant.objects.filter(pk=tenant_id).first()
        if tenant is not None and vision_status(tenant).config is not None:
            image_description_request(image_id=image_id)

    transaction.on_commit(queue)


@receiver(post_delete, sender=ArchivedImage, dispatch_uid="knowledge_image_description_delete")
def image_description_delete(sender: Any, instance: ArchivedImage, **kwargs: Any) -> None:
    tenant_id, sha256 = instance.tenant_id, instance.sha256

    def remove() -> None:
        # One DELETE … WHERE NOT EXISTS: no row of the tenant holds these bytes any more.
        still_held = ArchivedImage.objects.filter(tenant_id=tenant_id, sha256=sha256)
        ImageDescription.objects.filter(tenant_id=tenant_id, sha256=sha256).exclude(
            Exists(still_held)
        ).delete()

    transaction.on_commit(remove)
