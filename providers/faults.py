"""Redis faults the service rode out (the cache, the Celery broker, the compaction lock). Redis only caches,
carries task messages and locks; PostgreSQL holds everything a request needs. So a Redis fault is never a
request error: it is logged (once a minute per kind and process), counted (mnemo_degradations_total) and
remembered for the current request, whose context response lists it under `degradations`."""

import logging
import threading
import time
from contextvars import ContextVar

from django.core.signals import request_started

from providers.metrics import degradation_observe

logger = logging.getLogger(__name__)

CACHE_UNAVAILABLE = "cache_unavailable"
QUEUE_UNAVAILABLE = "queue_unavailable"
LOCK_UNAVAILABLE = "lock_unavailable"

MESSAGES = {
    CACHE_UNAVAILABLE: "The cache (Redis) did not answer; this request was served from the database.",
    QUEUE_UNAVAILABLE: (
        "Background work (compaction, embeddings, memory) could not be queued: the broker (Redis) did not "
        "answer. The periodic sweep queues it once the broker is back."
    ),
    LOCK_UNAVAILABLE: "The Redis lock did not answer; the database lease served instead.",
}
LOG_EVERY_SECONDS = 60.0

# The faults of the current request: a fresh list per request (request_started).
_request_faults: ContextVar[list[str] | None] = ContextVar("mnemo_service_faults", default=None)
_logged_at: dict[str, float] = {}
_log_lock = threading.Lock()


def service_fault(code: str, exc: BaseException | None = None) -> None:
    """Record that Redis failed as `code` (one of MESSAGES) and the caller went on without it."""
    degradation_observe(code=code)
    faults = _request_faults.get()
    if faults is None:  # before this module was imported, request_started could not reset it
        faults = []
        _request_faults.set(faults)
    if code not in faults:
        faults.append(code)
    now = time.monotonic()
    with _log_lock:
        if now - _logged_at.get(code, -LOG_EVERY_SECONDS) < LOG_EVERY_SECONDS:
            return
        _logged_at[code] = now
    logger.warning("%s (%s: %s); going on without Redis", code, type(exc).__name__ if exc else "-", exc)


def service_faults() -> list[tuple[str, str]]:
    """(code, message) of each fault the current request met so far."""
    return [(code, MESSAGES[code]) for code in list(_request_faults.get() or [])]


def service_faults_reset(**_: object) -> None:
    _request_faults.set([])


request_started.connect(service_faults_reset, dispatch_uid="mnemo.service_faults_reset")
