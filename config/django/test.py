"""Tests: the base settings with fast hashing, eager Celery and blobs in a throwaway folder."""

import tempfile
from pathlib import Path

from config.django.base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = True
MEDIA_ROOT = Path(tempfile.mkdtemp(prefix="mnemo-test-blobs-"))
LOGGING["root"]["level"] = "WARNING"  # noqa: F405
