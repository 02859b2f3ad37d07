"""One compaction per conversation at a time, across threads, processes and hosts: a Redis lock when
REDIS_URL is set, otherwise (and while Redis does not answer) a lease on the conversation's CompactionState
row taken with an atomic conditional update (PostgreSQL or SQLite).

Either is held for a short TTL (MNEMO_COMPACTION_LOCK_TTL_SECONDS) that a heartbeat thread of the holder
renews while it runs. A worker killed mid-run (SIGKILL, the hard time limit, a lost host) stops renewing, so
its lock is free within one TTL and the redelivered or retried task takes it: a dead owner never holds a
conversation for longer than its task's deadline. A run that outlives its lock finds out when it writes:
the boundary check (summaries.services.compaction) makes the second writer stale, never a double segment."""

import functools
import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from providers.faults import LOCK_UNAVAILABLE, service_fault
from summaries.models import CompactionState

logger = logging.getLogger(__name__)


class LockBusy(Exception):
    """Another compaction of this conversation is running."""


@functools.cache
def _redis(url: str) -> Any:
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=1)


def lock_key(conversation_id: uuid.UUID | str) -> str:
    return f"mnemo:lock:compaction:{conversation_id}"


def lock_ttl() -> int:
    return settings.MNEMO_COMPACTION_LOCK_TTL_SECONDS


@contextmanager
def compaction_lock(conversation_id: uuid.UUID | str, *, ttl: int | None = None) -> Iterator[None]:
    """Hold the conversation's compaction lock for the block, or raise LockBusy at once."""
    ttl = ttl or lock_ttl()
    if settings.REDIS_URL:
        try:
            lock = _redis_acquire(conversation_id, ttl=ttl)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            # Redis is down: every process falls back the same way, so the database lease is the lock now.
            service_fault(LOCK_UNAVAILABLE, exc)
        else:
            with _renewed(lambda: lock.extend(ttl, replace_ttl=True), ttl=ttl):
                try:
                    yield
                finally:
                    _redis_release(lock, conversation_id)
            return
    with _lease(conversation_id, ttl=ttl):
        yield


def _redis_acquire(conversation_id: Any, *, ttl: int) -> Any:
    # thread_local=False: the heartbeat thread extends the lock this thread took.
    lock = _redis(settings.REDIS_URL).lock(
        lock_key(conversation_id), timeout=ttl, blocking=False, thread_local=False
    )
    if not lock.acquire():
        raise LockBusy(str(conversation_id))
    return lock


def _redis_release(lock: Any, conversation_id: Any) -> None:
    try:
        lock.release()
    except redis.exceptions.LockError:
        # It expired while we ran (the heartbeat could not reach Redis): someone else may hold it now.
        logger.warning("compaction lock of %s expired before release", conversation_id)
    except redis.exceptions.RedisError as exc:
        service_fault(LOCK_UNAVAILABLE, exc)  # it expires on its own within one TTL


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

    def renew() -> bool:
        until = timezone.now() + timedelta(seconds=ttl)
        return bool(
            CompactionState.objects.filter(pk=conversation_id, lease_owner=owner).update(lease_until=until)
        )

    try:
        with _renewed(renew, ttl=ttl, database=True):
            yield
    finally:
        CompactionState.objects.filter(pk=conversation_id, lease_owner=owner).update(
            lease_owner="", lease_until=None
        )


@contextmanager
def _renewed(renew: Any, *, ttl: int, database: bool = False) -> Iterator[None]:
    """Call renew() every third of the TTL on a thread of its own until the block ends."""
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(ttl / 3):
                try:
                    if not renew():
                        logger.warning("compaction lock lost before its holder finished")
                        return
                except Exception as exc:  # Redis or the database did not answer: try again next beat
                    logger.warning("compaction lock renewal failed: %s", exc)
        finally:
            if database:
                connection.close()  # this thread's own connection

    thread = threading.Thread(target=beat, name="mnemo-lock-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
