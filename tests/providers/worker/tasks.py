"""Tasks only the embedded worker tests queue; the worker process imports them (settings.CELERY_IMPORTS)."""

import os

from celery import shared_task


@shared_task(name="tests.worker.echo")
def echo(value: str) -> None:
    from providers.background import server_notify

    server_notify("test_echo", [os.getpid(), value])


@shared_task(name="tests.worker.publish")
def publish(tenant_id: str, conversation_id: str) -> None:
    from conversations.events import event_publish

    event_publish(
        tenant_id=tenant_id, conversation_id=conversation_id, event="summary.updated", data={"n": 1}
    )


@shared_task(name="tests.worker.clear_mark")
def clear_mark(key: str) -> None:
    from providers.background import queued_mark_clear

    queued_mark_clear(key)
