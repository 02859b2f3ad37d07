"""A real Celery worker on the Redis broker (the PostgreSQL/Redis run only): a compaction queued on commit
travels through Redis and a worker thread completes it; duplicate triggers meanwhile collapse."""

import threading
import time

import pytest
from celery.signals import task_postrun
from django.conf import settings
from django.db import transaction

from config.celery import app
from conversations.models import Message
from summaries.models import CompactionState
from summaries.selectors import segments_live
from summaries.services import compaction_request
from tests.celery_conf import celery_conf_changed
from tests.summaries.helpers import history

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def test_a_real_worker_on_redis_completes_a_queued_compaction(conversation):
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL (the PostgreSQL/Redis run)")
    from celery.contrib.testing.worker import start_worker

    history(conversation, 20)
    ran: list[tuple[str, str]] = []

    def record(sender=None, retval=None, **kwargs):
        if sender is not None and sender.name == "summaries.tasks.compact_conversation":
            ran.append((threading.current_thread().name, retval))

    task_postrun.connect(record, weak=False)
    try:
        with (
            celery_conf_changed(task_always_eager=False),
            start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING", shutdown_timeout=20),
        ):
            with transaction.atomic():
                assert compaction_request(conversation=conversation, trigger="manual") is True
                assert compaction_request(conversation=conversation, trigger="manual") is False  # collapsed
            deadline = time.monotonic() + 30
            while not ran and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        task_postrun.disconnect(record)

    assert ran, "the worker did not run the queued compaction within 30 s"
    ((thread, result),) = ran
    assert thread != threading.current_thread().name  # not eager: a worker thread consumed it from Redis
    assert result == "compacted"
    assert Message.objects.filter(conversation=conversation, kind="compact_boundary").count() == 1
    assert len(segments_live(conversation=conversation)) == 1
    assert CompactionState.objects.get(pk=conversation.pk).queued_at is None
