"""Changing the Celery app's configuration for one test and giving it back."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from config.celery import app


@contextmanager
def celery_conf_changed(**values: Any) -> Iterator[None]:
    """Set `values` on the app's configuration, then take them out again. The app reads Django's settings
    through (CELERY_*) under a layer of changes: restoring by writing back the values read before would pin
    them in that layer, and a later test's settings (say CELERY_TASK_ALWAYS_EAGER) would no longer reach the
    app. Only the layer's own earlier entries are put back."""
    changes = app.conf.changes
    earlier = {key: changes[key] for key in values if key in changes}
    app.conf.update(values)
    try:
        yield
    finally:
        for key in values:
            changes.pop(key, None)
        changes.update(earlier)
