"""The embedded worker's child process (providers.embedded_worker starts it: `python -m
providers.embedded_child`): it runs the tasks that come down its stdin, one at a time, and speaks up its
stdout in the JSON-lines protocol that module describes. A module of its own, so that the server's side
(providers.background, providers.embedded_worker) never imports what only the child runs."""

import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

logger = logging.getLogger(__name__)


def protocol_sender(protocol: TextIO) -> Callable[[dict[str, Any]], None]:
    """How the child speaks up its stdout, one JSON line at a time from any thread. A server that has gone
    (it exited while a task ran) hears nothing more: the child's loop ends when its stdin closes, and a
    task's last word is not a BrokenPipeError traceback."""
    written = threading.Lock()

    def send(message: dict[str, Any]) -> None:
        with written:
            try:
                protocol.write(json.dumps(message, default=str) + "\n")
                protocol.flush()
            except (BrokenPipeError, ValueError):  # ValueError: the file was closed after an earlier break
                pass

    return send


def main() -> None:
    """The child: run the tasks that come down stdin, one at a time, and say when each is done."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # print() and any stray output go to stderr, never into the protocol
    sys.stdout = sys.stderr
    import django

    django.setup()
    # After setup: the Celery app is the project's, made when Django loaded its settings package, and the
    # background module reads the settings.
    from celery import current_app as app
    from django.db import close_old_connections

    from providers import background

    background.background_priority_lower()
    send = protocol_sender(protocol)
    background.server_notify_via(send)
    app.loader.import_default_modules()
    for line in sys.stdin:
        request = json.loads(line)
        send({"started": request["n"]})
        try:
            close_old_connections()
            app.tasks[request["task"]].apply(args=request["args"])
            background.background_join()  # and what the task queued in turn
        except Exception:
            logger.exception("embedded worker: task %s failed", request.get("task"))
        finally:
            close_old_connections()
            send({"done": request["n"]})


if __name__ == "__main__":
    main()
