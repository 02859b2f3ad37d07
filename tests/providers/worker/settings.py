"""Settings of the embedded worker process the tests of providers.embedded_worker start: the test settings,
a database of its own (the tests' is in memory, out of its reach), and the tasks below to run."""

import tempfile
from pathlib import Path

from config.django.test import *  # noqa: F403

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": Path(tempfile.mkdtemp(prefix="mnemo-worker-test-")) / "db.sqlite3",
    }
}
CELERY_IMPORTS = ["tests.providers.worker.tasks"]
