"""Writes of images: intake (validate, hash, dedup against the previous image, store the bytes), moves
to the cold tier, pins, retention purges and deletes. Bytes go through Django's storage API
(cold_storage.storage)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from cold_storage.imaging import (
    HASH_ALGORITHMS,
    DecodedImage,
    ImageRejected,
    b64decode,
    decode,
    grid_distance,
    hamming,
)
from cold_storage.models import ArchivedImage
from cold_storage.storage import COLD, HOT, tier_storage
from tenants.errors import ApplicationError
from tenants.models import Tenant

logger = logging.getLogger(__name__)


# --- policy -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImagePolicy:
    algorithm: str
    threshold: int
    dedup: bool
    retention_days: int
    grid_threshold: int | None = None  # None: the hash alone decides


def _setting_int(value: Any, default: int, *, minimum: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return default
    return number if number >= minimum else default


def image_policy(tenant_settings: dict[str, Any] | None) -> ImagePolicy:
    """The tenant's knobs (settings JSON: image_hash_algorithm, image_dedup_threshold, image_dedup,
    image_retention_days) over the server defaults; a malformed value falls back to the default."""
    knobs = tenant_settings or {}
    algorithm = knobs.get("image_hash_algorithm", settings.MNEMO_IMAGE_HASH_ALGORITHM)
    if algorithm not in HASH_ALGORITHMS:
        algorithm = settings.MNEMO_IMAGE_HASH_ALGORITHM
    return ImagePolicy(
        algorithm=algorithm,
        threshold=_setting_int(
            knobs.get("image_dedup_threshold"), settings.MNEMO_IMAGE_DEDUP_THRESHOLD, minimum=0
        ),
        dedup=knobs.get("image_dedup", True) is not False,
        retention_days=_setting_int(
            knobs.get("image_retention_days"), settings.MNEMO_IMAGE_RETENTION_DAYS, minimum=1
        ),
        grid_threshold=_grid_threshold(knobs.get("image_dedup_grid_threshold", _UNSET)),
    )


_UNSET = object()


def _grid_threshold(value: Any) -> int | None:
    if value is _UNSET:
        return settings.MNEMO_IMAGE_DEDUP_GRID_THRESHOLD
    if value is None or value is False:
        return None  # the tenant turned the guard off
    return _setting_int(value, settings.MNEMO_IMAGE_DEDUP_GRID_THRESHOLD or 0, minimum=0)


# --- intake -----------------------------------------------------------------------------------------------


def image_decode(*, data: bytes | str, media_type: str | None = None) -> DecodedImage:
    """Validate and hash one image (bytes, or base64 text). Refusals are ApplicationError 400 with code
    invalid_image, image_format_not_allowed or image_too_large; nothing is stored either way."""
    try:
        raw = b64decode(data) if isinstance(data, str) else data
        return decode(
            raw,
            allowed_formats=tuple(settings.MNEMO_IMAGE_FORMATS),
            max_pixels=settings.MNEMO_IMAGE_MAX_PIXELS,
            max_bytes=settings.MNEMO_IMAGE_MAX_BYTES,
            declared_media_type=media_type,
        )
    except ImageRejected as exc:
        raise ApplicationError(exc.message, code=exc.code, extra=exc.extra) from None


@dataclass
class BlobWrites:
    """Files written during one intake, so a failed transaction can remove them again."""

    written: list[tuple[str, str]] = field(default_factory=list)

    def discard(self) -> None:
        for tier, key in self.written:
            try:
                tier_storage(tier).delete(key)
            except OSError:
                logger.exception("could not remove %s blob %s after a rollback", tier, key)
        self.written.clear()


def _is_duplicate(decoded: DecodedImage, root: ArchivedImage, policy: ImagePolicy) -> int | None:
    """The Hamming distance when ``decoded`` may stand as a duplicate of ``root``, else None. The root must
    still show its pixels to the model (not compacted, not purged)."""
    if (
        not policy.dedup
        or root.compacted_at is not None
        or root.purged_at is not None
        or not root.storage_key
    ):
        return None
    if (decoded.width, decoded.height) != (root.width, root.height):
        return None
    distance = hamming(decoded.hash(policy.algorithm), root.hash_value(policy.algorithm))
    if distance > policy.threshold:
        return None
    if (
        policy.grid_threshold is not None
        and grid_distance(decoded.grid, bytes(root.grid)) > policy.grid_threshold
    ):
        return None
    return distance


def image_store(
    *,
    tenant_id: Any,
    conversation_id: Any,
    turn_id: Any,
    message_id: Any,
    message_seq: int,
    part_index: int,
    decoded: DecodedImage,
    role: str,
    previous: ArchivedImage | None,
    policy: ImagePolicy,
    blobs: BlobWrites,
) -> ArchivedImage:
    """Store one validated image. Within the tenant's threshold of ``previous`` (the conversation's newest
    image) it is a duplicate: a row pointing at the original, no new bytes. Call inside the transaction
    that writes the message, with the conversation locked so "previous" cannot move meanwhile."""
    root = None
    if previous is not None:
        root = previous.duplicate_of if previous.duplicate_of_id else previous
    distance = _is_duplicate(decoded, root, policy) if root is not None else None
    image = ArchivedImage(
        tenant_id=tenant_id,
        conversation_id=conversation_id,
        turn_id=turn_id,
        message_id=message_id,
        message_seq=message_seq,
        part_index=part_index,
        sha256=decoded.sha256,
        phash=decoded.phash,
        dhash=decoded.dhash,
        ahash=decoded.ahash,
        grid=decoded.grid,
        width=decoded.width,
        height=decoded.height,
        format=decoded.format,
        media_type=decoded.media_type,
        size=decoded.size,
        role=role,
    )
    if distance is not None:
        image.duplicate_of = root
        image.hamming_distance = distance
    else:
        name = f"{_hex(tenant_id)}/{_hex(conversation_id)}/{image.id}.{decoded.extension}"
        image.storage_key = tier_storage(HOT).save(name, ContentFile(decoded.data))
        blobs.written.append((HOT, image.storage_key))
    image.save(force_insert=True)
    return image


def _hex(value: Any) -> str:
    return getattr(value, "hex", None) or str(value).replace("-", "")


# --- compaction support -----------------------------------------------------------------------------------


def images_mark(*, roles: dict[str, str], compacted: set[str], now: Any) -> None:
    """Record the compaction decision of one turn: each image's role, and which became placeholders."""
    by_role: dict[str, list[str]] = {}
    for image_id, role in roles.items():
        by_role.setdefault(role, []).append(image_id)
    for role, ids in by_role.items():
        ArchivedImage.objects.filter(pk__in=ids).update(role=role)
    if compacted:
        ArchivedImage.objects.filter(pk__in=compacted, compacted_at__isnull=True).update(compacted_at=now)
        # A duplicate has no bytes to move: it is cold as soon as it is compacted.
        ArchivedImage.objects.filter(pk__in=compacted, storage_key="", purged_at__isnull=True).update(
            tier=ArchivedImage.Tier.COLD
        )


def images_move_to_cold(*, image_ids: list[str]) -> int:
    """Move the bytes of these images from the hot to the cold tier; returns how many moved. Safe to run
    twice or concurrently: the row flips to cold with a conditional update, and the loser of a race deletes
    the copy it made. The hot file is removed only after the row points at the cold one."""
    moved = 0
    hot, cold = tier_storage(HOT), tier_storage(COLD)
    candidates = ArchivedImage.objects.filter(
        pk__in=image_ids, tier=ArchivedImage.Tier.HOT, purged_at__isnull=True
    ).exclude(storage_key="")
    for image in candidates:
        try:
            with hot.open(image.storage_key, "rb") as handle:
                data = handle.read()
        except OSError:
            logger.exception("image %s: hot bytes unreadable, left in the hot tier", image.id)
            continue
        cold_key = cold.save(image.storage_key, ContentFile(data))
        updated = ArchivedImage.objects.filter(
            pk=image.pk, tier=ArchivedImage.Tier.HOT, storage_key=image.storage_key
        ).update(tier=ArchivedImage.Tier.COLD, storage_key=cold_key)
        if updated:
            hot.delete(image.storage_key)
            moved += 1
        else:
            cold.delete(cold_key)
    return moved


# --- pins, retention, deletes -----------------------------------------------------------------------------


def image_pin(*, image: ArchivedImage, pinned: bool = True) -> ArchivedImage:
    """Pin (or unpin) an image; pinning a duplicate pins the original whose bytes it shows."""
    ids = [image.id] if not image.duplicate_of_id or not pinned else [image.id, image.duplicate_of_id]
    ArchivedImage.objects.filter(pk__in=ids).update(pinned=pinned)
    image.pinned = pinned
    return image


def image_touch(*, image: ArchivedImage) -> None:
    """Record a read, at most once a minute per image, so retrieval stays a read on the hot path."""
    now = timezone.now()
    if image.last_accessed_at is None or now - image.last_accessed_at > timedelta(minutes=1):
        ArchivedImage.objects.filter(pk=image.pk).update(last_accessed_at=now)
        image.last_accessed_at = now


@dataclass
class PurgeReport:
    images: int = 0
    bytes: int = 0
    tenants: dict[str, dict[str, int]] = field(default_factory=dict)
    moved_to_cold: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "images": self.images,
            "bytes": self.bytes,
            "tenants": self.tenants,
            "moved_to_cold": self.moved_to_cold,
        }


def images_purge_expired(*, now: Any = None, batch: int = 500) -> PurgeReport:
    """Delete the bytes of cold, unpinned images older than their tenant's retention; the rows stay (marked
    purged) so a placeholder still names what was there and GET answers 410. Also finishes moves to the cold
    tier that a failed background task left undone. Returns what it freed."""
    now = now or timezone.now()
    report = PurgeReport()
    stranded = list(
        ArchivedImage.objects.filter(
            compacted_at__isnull=False, tier=ArchivedImage.Tier.HOT, purged_at__isnull=True
        )
        .exclude(storage_key="")
        .values_list("pk", flat=True)[:batch]
    )
    if stranded:
        report.moved_to_cold = images_move_to_cold(image_ids=stranded)

    expiring = ArchivedImage.objects.filter(
        tier=ArchivedImage.Tier.COLD, pinned=False, purged_at__isnull=True
    )
    tenant_ids = set(expiring.values_list("tenant_id", flat=True).distinct())
    for tenant in Tenant.objects.filter(pk__in=tenant_ids):
        cutoff = now - timedelta(days=image_policy(tenant.settings).retention_days)
        # An original whose duplicate is pinned, or still shown (not compacted), keeps its bytes too.
        needed = ArchivedImage.objects.filter(duplicate_of=OuterRef("pk")).filter(
            Q(pinned=True) | Q(compacted_at__isnull=True)
        )
        candidates = expiring.filter(tenant=tenant, created_at__lt=cutoff).exclude(Exists(needed))
        freed_images = freed_bytes = 0
        while True:
            rows = list(candidates.values_list("pk", "storage_key", "size")[:batch])
            if not rows:
                break
            for pk, key, size in rows:
                with transaction.atomic():
                    updated = ArchivedImage.objects.filter(
                        pk=pk, purged_at__isnull=True, pinned=False
                    ).update(purged_at=now, storage_key="")
                if not updated:
                    continue
                if key:
                    try:
                        tier_storage(COLD).delete(key)
                    except OSError:
                        logger.exception("image %s: could not delete cold bytes %s", pk, key)
                        continue
                    freed_bytes += size
                freed_images += 1
        if freed_images:
            report.tenants[tenant.slug] = {"images": freed_images, "bytes": freed_bytes}
            report.images += freed_images
            report.bytes += freed_bytes
    return report


def images_delete_for_conversation(*, conversation_id: Any) -> int:
    """Delete every image row of a conversation; their files go when the transaction commits (a rollback
    keeps both). Returns the number of rows."""
    rows = list(
        ArchivedImage.objects.filter(conversation_id=conversation_id)
        .exclude(storage_key="")
        .values_list("tier", "storage_key")
    )
    count, _ = ArchivedImage.objects.filter(conversation_id=conversation_id).delete()

    def remove_files() -> None:
        for tier, key in rows:
            try:
                tier_storage(tier).delete(key)
            except OSError:
                logger.exception("could not delete %s blob %s", tier, key)

    transaction.on_commit(remove_files)
    return count


def image_input_error(message: str, *, index: int | None = None, **extra: Any) -> ApplicationError:
    if index is not None:
        extra["index"] = index
    return ApplicationError(message, code="invalid_image", extra=extra)
