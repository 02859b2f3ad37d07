"""Reads of images, always inside one tenant, and of their bytes from whichever tier holds them."""

import hashlib
import uuid

from django.http import Http404
from rest_framework import status

from cold_storage.models import ArchivedImage
from cold_storage.storage import tier_storage
from tenants.errors import ApplicationError
from tenants.models import Tenant
from tenants.validation import text_is_clean


def access_image(*, tenant: Tenant | uuid.UUID, image_id: str) -> ArchivedImage:
    """The image with this id in the tenant (``tenant`` may be a Tenant or its id), else 404; an id the
    column cannot hold (too long, a NUL) is a 404 without a query."""
    if not text_is_clean(image_id, max_length=ArchivedImage._meta.pk.max_length):
        raise Http404
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    image = (
        ArchivedImage.objects.select_related("duplicate_of").filter(pk=image_id, tenant_id=tenant_id).first()
    )
    if image is None:
        raise Http404
    return image


class ImageBytesUnavailable(ApplicationError):
    pass


def image_bytes(image: ArchivedImage) -> bytes:
    """The bytes this image shows (a duplicate shows its original's), from the tier that holds them, checked
    against their sha256. ImageBytesUnavailable (410 image_purged, 500 image_corrupt / image_missing) when
    they cannot be served."""
    source = image.duplicate_of or image  # duplicate_of is None, read without a query, for an original
    if source.purged_at is not None or not source.storage_key:
        raise ImageBytesUnavailable(
            "The bytes of this image were deleted by retention.",
            code="image_purged",
            status_code=status.HTTP_410_GONE,
            extra={
                "image_id": image.id,
                "purged_at": source.purged_at.isoformat() if source.purged_at else None,
            },
        )
    try:
        with tier_storage(source.tier).open(source.storage_key, "rb") as handle:
            data = handle.read()
    except (FileNotFoundError, OSError):
        raise ImageBytesUnavailable(
            "The bytes of this image are missing from storage.",
            code="image_missing",
            status_code=status.HTTP_500_INTERNAL_SERVER_ERROR,
            extra={"image_id": image.id, "tier": source.tier},
        ) from None
    if hashlib.sha256(data).hexdigest() != source.sha256:
        raise ImageBytesUnavailable(
            "The stored bytes of this image do not match its sha256.",
            code="image_corrupt",
            status_code=status.HTTP_500_INTERNAL_SERVER_ERROR,
            extra={"image_id": image.id, "tier": source.tier},
        )
    return data


def images_by_id(*, tenant_id: uuid.UUID, image_ids: set[str]) -> dict[str, ArchivedImage]:
    if not image_ids:
        return {}
    rows = ArchivedImage.objects.select_related("duplicate_of").filter(tenant_id=tenant_id, pk__in=image_ids)
    return {row.id: row for row in rows}


def image_previous(*, conversation_id: uuid.UUID) -> ArchivedImage | None:
    """The newest image of the conversation (by message seq, then place in the message)."""
    return (
        ArchivedImage.objects.select_related("duplicate_of")
        .filter(conversation_id=conversation_id)
        .order_by("-message_seq", "-part_index")
        .first()
    )
