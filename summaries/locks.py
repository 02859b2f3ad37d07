"""One compaction per conversation at a time, across threads, processes and hosts: a Redis lock when
REDIS_URL is set, otherwise a lease on the conversation's CompactionState row taken with an atomic
conditional update (PostgreSQL or SQLite). Both expire, so a worker killed mid-run cannot hold a
conversation forever."""

import functools
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from summaries.models import CompactionState

logger = logging.getLogger(__name__)


class LockBusy(Exception):
    """Another compaction of this conversation is running."""


@functools.cache
def _redis(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_timeout=5)


def lock_key(conversation_id: Any) -> str:
    return f"mnemo:lock:compaction:{conversation_id}"


@contextmanager
def compaction_lock(conversation_id: Any, *, ttl: int) -> Iterator[None]:
    """Hold the conversation's compaction lock for the block, or raise LockBusy at once."""
    if settings.REDIS_URL:
        with _redis_lock(conversation_id, ttl=ttl):
            yield
    else:
        with _lease(conversation_id, ttl=ttl):
            yield


@contextmanager
def _redis_lock(conversation_id: Any, *, ttl: int) -> Iterator[None]:
    import redis

    lock = _redis(settings.REDIS_URL).lock(lock_key(conversation_id), timeout=ttl, blocking=False)
    if not lock.acquire():
        raise LockBusy(str(conversation_id))
    try:
        yield
    finally:
        try:
            lock.release()
        except redis.exceptions.LockError:
            # It expired while we ran (a run longer than the hard time limit): someone else may hold it now.
            logger.warning("compaction lock of %s expired before release", conversation_id)


@contextmanager
def _lease(conversation_id: Any, *, ttl: int) -> Iterator[None]:
    CompactionState.objects.get_or_create(conversation_id=conversation_id)
    owner = uuid.uuid4().hex
    now = timezone.now()
    taken = (
        CompactionState.objects.filter(pk=conversation_id)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .update(lease_owner=owner, lease_until=now + timedelta(seconds=ttl))
    )
    if not taken:
        raise LockBusy(str(conversation_id))
    try:
        yield
    finally:
        CompactionState.objects.filter(pk=conversation_id, lease_owner=owner).update(
            lease_owner="", lease_until=None
        )
