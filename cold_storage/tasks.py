"""Background work on images. Tasks take ids, import their service inside, and return quietly when the rows
are gone."""

import logging

from celery import shared_task

from cold_storage.services import images_move_to_cold as move
from cold_storage.services import images_purge_expired as purge

logger = logging.getLogger(__name__)


@shared_task(autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def images_move_to_cold(image_ids: list[str]) -> int:
    """Move compacted images' bytes to the cold tier (queued when a turn is compacted)."""
    return move(image_ids=image_ids)


@shared_task
def images_purge_expired() -> dict:
    """Daily (CELERY_BEAT_SCHEDULE): delete the bytes of cold, unpinned images past their tenant's
    retention, and report what was freed."""
    report = purge().as_dict()
    logger.info(
        "image retention: freed %s images, %s bytes (moved %s stranded images to cold) %s",
        report["images"],
        report["bytes"],
        report["moved_to_cold"],
        report["tenants"],
    )
    return report
