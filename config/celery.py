"""The Celery app. Without REDIS_URL tasks run eagerly in-process; with it, on a Redis broker."""

import os

from celery import Celery
from celery.signals import worker_init

from providers.metrics import celery_task_metrics_connect

# Workers and beat run with production settings unless told otherwise (config/asgi.py says why).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.django.production")

app = Celery("mnemo")
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
