"""Work a request queues for later. With a real Celery broker it is a task message; in the embedded mode
(eager Celery, no broker) eager tasks would run inside the request that queued them, so they run on one
thread of this process instead (MNEMO_EAGER_TASKS_IN_THREAD; tests turn it off to run them inline). A task
queued again while it waits runs once. A broker that does not answer is logged, never a request error."""

import logging
import queue
import threading
import time
from typing import Any, Protocol

from django.conf import settings
from django.db import close_old_connections

from providers.faults import QUEUE_UNAVAILABLE, service_fault

logger = logging.getLogger(__name__)


class Task(Protocol):
    """A Celery task, as far as queueing it goes (celery ships no type information)."""

    name: str

    def apply_async(self, args: tuple[Any, ...], countdown: float | None = None) -> object: ...

    def apply(self, args: tuple[Any, ...]) -> object: ...


class _Runner:
    """One thread per process; the same (task, arguments) queued twice before it runs is run once."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Any, tuple[Any, ...]]] = queue.Queue()
        self._pending: set[tuple[str, tuple[Any, ...]]] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, task: Any, args: tuple[Any, ...]) -> None:
        key = (task.name, args)
        with self._lock:
            if key in self._pending:
                return
            self._pending.add(key)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="mnemo-background", daemon=True)
                self._thread.start()
        self._queue.put((task, args))

    def _run(self) -> None:
        while True:
            task, args = self._queue.get()
            with self._lock:
                self._pending.discard((task.name, args))
            try:
                close_old_connections()
                task.apply(args=args)
            except Exception:
                logger.exception("background task %s%r failed", task.name, args)
            finally:
                close_old_connections()
                self._queue.task_done()

    def join(self) -> None:
        """Wait until everything queued so far has run (tests and benchmarks)."""
        self._queue.join()


_runner = _Runner()


# After the broker failed to take a message, messages are not even tried for this long: while Redis is down a
# request does not wait on it once per task.
BROKER_PAUSE_SECONDS = 5.0
_broker_down_until = 0.0


def task_send(task: Task, *args: Any, countdown: float | None = None) -> bool:
    """Queue a Celery task: to the broker (after `countdown` seconds), to this process's background thread
    (embedded mode), or run it now (eager tests). When the broker does not take it, the failure is logged and
    recorded (providers.faults: the context response lists it), never raised: the work is found again by
    the periodic sweeps (summaries' compaction catch-up, conversations' vector sweep). Returns whether the
    task was queued."""
    global _broker_down_until
    if settings.CELERY_TASK_ALWAYS_EAGER and settings.MNEMO_EAGER_TASKS_IN_THREAD:
        _runner.submit(task, args)
        return True
    if settings.CELERY_TASK_ALWAYS_EAGER:
        task.apply_async(args, countdown=countdown)  # eager (tests): runs now, its errors propagate
        return True
    if time.monotonic() < _broker_down_until:
        service_fault(QUEUE_UNAVAILABLE)
        return False
    try:
        task.apply_async(args, countdown=countdown)
    except Exception as exc:
        _broker_down_until = time.monotonic() + BROKER_PAUSE_SECONDS
        service_fault(QUEUE_UNAVAILABLE, exc)
        logger.warning("could not queue %s%r: %s", task.name, args, exc)
        return False
    return True


def background_join() -> None:
    _runner.join()
