"""Tests: the base settings with fast hashing, eager Celery and blobs in a throwaway folder."""

import os
import re
import tempfile
from pathlib import Path


def _worker_redis_url(url: str, worker: str) -> str:
    """REDIS_URL with a database of this pytest-xdist worker's own (gw0 keeps the URL's, gw1 the next…):
    tests clear the cache, and a clear on a database another worker shares would drop that worker's keys
    mid-test. Subprocesses a test starts inherit it from the environment."""
    number = int(worker.removeprefix("gw"))
    match = re.search(r"/(\d+)$", url)
    base = int(match.group(1)) if match else 0
    stem = url[: match.start()] if match else url.rstrip("/")
    return f"{stem}/{base + number}"


# Before the base settings read it: the cache, the channel layer and the broker all follow REDIS_URL. Once per
# worker: a subprocess a test starts inherits the marker, and keeps the REDIS_URL the test gave it.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER and os.environ.get("REDIS_URL") and not os.environ.get("MNEMO_TEST_REDIS_PER_WORKER"):
    os.environ["REDIS_URL"] = _worker_redis_url(os.environ["REDIS_URL"], _WORKER)
    os.environ["MNEMO_TEST_REDIS_PER_WORKER"] = "1"

from config.django.base import *  # noqa: E402, F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Tasks run inline in the test process, whatever a developer's .env says for production. A real `celery
# worker` a test starts (tests/faults) is marked, so that what its tasks queue (a retry, a follow-up) goes
# through the broker as in production.
CELERY_TASK_ALWAYS_EAGER = not os.environ.get("MNEMO_TEST_CELERY_WORKER")
MEDIA_ROOT = Path(tempfile.mkdtemp(prefix="mnemo-test-blobs-"))
LOGGING["root"]["level"] = "WARNING"  # noqa: F405
# Eager tasks run inline, so a test sees their effect; message vectors only where a test asks for them.
MNEMO_EAGER_TASKS_IN_THREAD = False
MNEMO_EMBED_ON_APPEND = False
MNEMO_WARM_ON_START = False
MNEMO_EMBEDDED_BEAT = False
MNEMO_CONTEXT_STATS_FLUSH_SECONDS = 0  # written by each call, so a test sees it
