"""A prefork Celery worker's tasks reuse its pooled database connections (config.celery's
PoolKeepingWorkerFixup). With Celery's own Django fixup every task closed the worker's pool and the next one
opened a new one: PostgreSQL started a backend process for each connection, task after task
(celery/celery#10554)."""

import uuid

import pytest
from django.db import connection

from conversations.tasks import message_vectors_conversation
from tests.faults.conftest import Worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TASKS = 8


def sessions_started() -> int:
    """Sessions PostgreSQL has started on the test database so far (its cumulative statistics)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def tasks_run(worker: Worker, count: int) -> None:
    """Queue `count` tasks that each read the database (a conversation that does not exist: nothing to
    embed) and wait until the worker has run them all."""
    done = worker.output().count(" succeeded in ")
    for _ in range(count):
        message_vectors_conversation.apply_async((str(uuid.uuid4()),))
    wait_for(
        lambda: worker.output().count(" succeeded in ") >= done + count or not worker.alive(),
        timeout=60,
        what=f"{count} tasks run",
        detail=lambda: worker.output()[-3000:],
    )
    assert worker.alive(), worker.output()[-3000:]


def test_a_prefork_workers_tasks_reuse_its_pooled_connections(workers):
    worker = workers(pool="prefork", MNEMO_EMBEDDINGS="none")
    tasks_run(worker, 1)  # the child's first task opens its pool
    before = sessions_started()

    tasks_run(worker, TASKS)

    # Celery's fixup: at least one new session per task (a new pool each time). Kept: none, or the pool
    # replacing a connection now and then.
    assert sessions_started() - before <= 2
