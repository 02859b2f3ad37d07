"""The Celery app. Without REDIS_URL tasks run eagerly in-process; with it, on a Redis broker."""

import os

from celery import Celery

from providers.metrics import celery_task_metrics_connect

# Workers and beat run with production settings unless told otherwise (config/asgi.py says why).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.django.production")

app = Celery("mnemo")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Outcome and duration of every task, eager or on a worker (mnemo_task_duration_seconds).
celery_task_metrics_connect()
