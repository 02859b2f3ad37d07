"""The Celery app. Without REDIS_URL tasks run eagerly in-process; with it, on a Redis broker."""

import os
from typing import Any

from celery import Celery
from celery.fixups.django import DjangoFixup, DjangoWorkerFixup
from celery.signals import worker_init

from providers.metrics import celery_task_metrics_connect

# Workers and beat run with production settings unless told otherwise (config/asgi.py says why).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.django.production")


class PoolKeepingWorkerFixup(DjangoWorkerFixup):
    """Celery's Django fixup, but a task hands its database connections back to the pool instead of closing
    the pool. Celery's closes the whole pool before and after every task of a prefork worker
    (celery/celery#10554), so each task opened a new pool: PostgreSQL started a backend process for each of
    its connections, and the worker waited for the connection, its authentication and its time zone, task
    after task, on the cores the server shares. Here a task's end is a request's end (Django's
    close_old_connections: a connection past CONN_MAX_AGE, 0 here, goes back to the pool, a broken one is
    dropped). A pool inherited across the fork is still closed when the child starts
    (on_worker_process_init), so no two processes share one."""

    def on_task_prerun(self, sender: Any, **kwargs: Any) -> None:
        if not getattr(sender.request, "is_eager", False):
            self._db.close_old_connections()

    def on_task_postrun(self, sender: Any, **kwargs: Any) -> None:
        if not getattr(sender.request, "is_eager", False):
            self._db.close_old_connections()
            self.close_cache()


class PoolKeepingFixup(DjangoFixup):
    """Celery's Django fixup (django.setup() before the tasks load, the task class, the worker's signals)
    with PoolKeepingWorkerFixup as its worker part, made when a worker starts, as Celery makes its own."""

    _pool_keeping: DjangoWorkerFixup | None = None

    @property
    def worker_fixup(self) -> DjangoWorkerFixup:
        if self._pool_keeping is None:
            self._pool_keeping = PoolKeepingWorkerFixup(self.app)
        return self._pool_keeping

    @worker_fixup.setter
    def worker_fixup(self, value: DjangoWorkerFixup) -> None:
        self._pool_keeping = value


def pool_keeping_fixup(app: Celery) -> DjangoFixup | None:
    """Installed in place of Celery's built-in Django fixup, under the same condition."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return None
    return PoolKeepingFixup(app).install()


app = Celery("mnemo", fixups=[pool_keeping_fixup])
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Outcome and duration of every task, eager or on a worker (mnemo_task_duration_seconds).
celery_task_metrics_connect()


@worker_init.connect
def _background_priority(**_kwargs: object) -> None:
    """A worker (and the pool processes it forks) runs below the server's CPU priority."""
    # Imported here: this module loads with the settings package, before Django is set up.
    from providers.background import background_priority_lower

    background_priority_lower()
