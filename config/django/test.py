"""Tests: the base settings with fast hashing, eager Celery and blobs in a throwaway folder."""

import tempfile
from pathlib import Path

from config.django.base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = True
MEDIA_ROOT = Path(tempfile.mkdtemp(prefix="mnemo-test-blobs-"))
LOGGING["root"]["level"] = "WARNING"  # noqa: F405
# Eager tasks run inline, so a test sees their effect; message vectors only where a test asks for them.
MNEMO_EAGER_TASKS_IN_THREAD = False
MNEMO_EMBED_ON_APPEND = False
MNEMO_WARM_ON_START = False
MNEMO_EMBEDDED_BEAT = False
MNEMO_CONTEXT_STATS_FLUSH_SECONDS = 0  # written by each call, so a test sees it
