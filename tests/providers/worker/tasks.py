"""Tasks only the embedded worker tests queue; the worker process imports them (settings.CELERY_IMPORTS)."""

import os
from pathlib import Path

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


@shared_task(name="tests.worker.fill")
def fill(store: str, mark: str) -> None:
    """A stand-in for a vector fill: it starts (clearing its mark), reads what has been appended so far (the
    lines of a file) and records what it read. The server's test holds its reader meanwhile (test_hold)."""
    from providers.background import server_notify, task_started

    server_notify("test_hold", None)
    task_started(mark)
    seen = Path(store).read_text().count("\n")
    Path(f"{store}.seen").write_text(str(seen))
