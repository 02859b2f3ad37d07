"""Background work of the prefix-cache app: the daily prune of the dashboard's context-call rollups."""

import logging

from celery import shared_task

from prefix_cache.services import context_stats_prune as prune

logger = logging.getLogger(__name__)


@shared_task
def context_stats_prune() -> int:
    """Daily (CELERY_BEAT_SCHEDULE): delete hourly context-call rollups past CONTEXT_STATS_DAYS."""
    deleted = prune()
    logger.info("context call statistics: deleted %s hourly rows", deleted)
    return deleted
