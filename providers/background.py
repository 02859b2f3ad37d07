"""Work a request queues for later. With a real Celery broker it is a task message; in the embedded mode
(eager Celery, no broker) eager tasks would run inside the request that queued them, so they run elsewhere
(MNEMO_EAGER_TASKS_IN_THREAD; tests turn it off to run them inline): in a worker process of the server's own
(providers.embedded_worker; MNEMO_EMBEDDED_WORKER "process", the default) or on one thread of this process
("thread"). A task queued again while it waits runs once; task_queue_once spares the queue a message per
request. A broker that does not answer is logged, never a request error."""

import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings
from django.core.cache import cache
from django.db import close_old_connections

from providers.embedded_worker import CHILD_ENV, EmbeddedWorker
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
_worker: Any = None  # providers.embedded_worker.EmbeddedWorker, started on first use
_worker_lock = threading.Lock()


def _embedded_submit(task: Any, args: tuple[Any, ...]) -> bool:
    global _worker
    if settings.MNEMO_EMBEDDED_WORKER != "process" or in_embedded_worker():
        _runner.submit(task, args)  # the worker process itself runs what its tasks queue on its thread
        return True
    with _worker_lock:
        if _worker is None:
            _worker = EmbeddedWorker(cwd=settings.BASE_DIR, on_message=_from_worker)
    try:
        _worker.submit(task, args)
    except OSError as exc:  # the worker could not be started: logged, never a request error (the sweeps)
        service_fault(QUEUE_UNAVAILABLE, exc)
        logger.warning("could not start the embedded worker for %s: %s", task.name, exc)
        return False
    return True


# --- what only the serving process can do -----------------------------------------------------------------

_handlers: dict[str, Callable[[Any], object]] = {}
_notify: Callable[[dict[str, Any]], None] | None = None


def in_embedded_worker() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def server_handler(kind: str, handler: Callable[[Any], object]) -> None:
    """What the serving process does with a `kind` message from its embedded worker (apps register these
    when they are ready)."""
    _handlers[kind] = handler


def server_notify_via(send: Callable[[dict[str, Any]], None]) -> None:
    global _notify
    _notify = send


def server_notify(kind: str, payload: object) -> bool:
    """In the embedded worker process: have the serving process run its `kind` handler on `payload` (JSON).
    False elsewhere: the caller does it itself."""
    if _notify is None:
        return False
    _notify({"kind": kind, "payload": payload})
    return True


def _from_worker(message: dict[str, Any]) -> None:
    handler = _handlers.get(message.get("kind", ""))
    if handler is None:
        logger.warning("no handler for the embedded worker's %r", message.get("kind"))
        return
    try:
        handler(message.get("payload"))
    except Exception:
        logger.exception("handling the embedded worker's %r failed", message.get("kind"))
    finally:
        close_old_connections()


# After the broker failed to take a message, messages are not even tried for this long: while Redis is down a
# request does not wait on it once per task.
BROKER_PAUSE_SECONDS = 5.0
_broker_down_until = 0.0


def task_send(task: Task, *args: Any, countdown: float | None = None) -> bool:
    """Queue a Celery task: to the broker (after `countdown` seconds), to the server's worker process or
    background thread (embedded mode), or run it now (eager tests). When the broker does not take it, the
    failure is logged and recorded (providers.faults: the context response lists it), never raised: the work
    is found again by the periodic sweeps (summaries' compaction catch-up, conversations' vector sweep).
    Returns whether the task was queued."""
    global _broker_down_until
    if _embedded():
        return _embedded_submit(task, args)
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


def _embedded() -> bool:
    return bool(settings.CELERY_TASK_ALWAYS_EAGER and settings.MNEMO_EAGER_TASKS_IN_THREAD)


def task_queue_once(
    task: Task, *args: Any, mark: str, mark_seconds: int, countdown: float | None = None
) -> bool:
    """Queue a run of `task(*args)` unless one is queued and has not started: requests in a burst share one
    run. The run calls task_started(mark) before it reads anything, so every request is served by a run that
    starts after it, whatever the interleaving. Returns whether a run is queued (now or already).

    In the embedded mode the server's own queue keeps each waiting task once and lets go of it as a runner
    takes it, in the process that queues; a cache mark would live in the serving process's memory while the
    run that must clear it is in the worker process, and a request between the run's first read and the
    clear reaching the server was lost. With a broker the mark is in the shared cache (Redis), one cache
    operation per request instead of a task message; it expires so that a lost run is replaced."""
    if _embedded():
        return _embedded_submit(task, args)
    if not cache.add(mark, 1, timeout=mark_seconds):
        return True
    return task_send_marked(task, *args, release=lambda: cache.delete(mark), countdown=countdown)


def task_send_marked(
    task: Task, *args: Any, release: Callable[[], object], countdown: float | None = None
) -> bool:
    """Send a run whose "queued" mark the caller has just set (task_queue_once's cache key, or a column of
    a row that shows the mark, as compaction's queued_at). When the task cannot be queued the mark is
    released: the broker is down (logged, recorded), and the next request or the periodic sweep queues it
    again instead of waiting for the mark to expire. Returns whether the task was queued."""
    if task_send(task, *args, countdown=countdown):
        return True
    release()
    return False


def task_started(mark: str) -> None:
    """Called by a run of task_queue_once before it reads its work: requests from now on queue the next."""
    cache.delete(mark)


def retry_countdown(retries: int) -> float:
    """Seconds before a task's next retry: doubling from 5 s, capped at 5 minutes, with jitter so a burst
    of retries does not arrive together."""
    return min(300.0, 5.0 * 2**retries) * random.uniform(0.8, 1.2)  # noqa: S311


def background_join() -> None:
    if _worker is not None and not in_embedded_worker():
        _worker.join()
    _runner.join()


def background_priority_lower() -> None:
    """In a process that only runs background work (a Celery worker, the embedded worker): lower its CPU
    priority by MNEMO_BACKGROUND_NICE, so that on cores it shares with a server the requests are served
    first and embeddings, the memory agent and compaction take what is left (they catch up once the load
    eases). A system that refuses the change leaves the priority as it was."""
    if settings.MNEMO_BACKGROUND_NICE:
        try:
            nice = os.nice(settings.MNEMO_BACKGROUND_NICE)
            _autogroup_lower(nice)
        except OSError as exc:
            logger.warning("background priority left as it was: %s", exc)


AUTOGROUP = Path("/proc/self/autogroup")


def _autogroup_lower(nice: int) -> None:
    """Linux shares the CPU between sessions first (autogroup, on by default on many systems) and weighs a
    niceness only inside its session: a worker that leads a session of its own (started by a service manager,
    by `setsid`, in a terminal of its own) took as much CPU as the server however nice it was. Such a worker's
    group holds only it and the processes it forks, so the group is given the same niceness. A worker that
    shares its session (the embedded worker, the server's child) shares its group with the server, which
    keeps its priority: there the process's own niceness already weighs."""
    if os.getsid(0) != os.getpid() or not AUTOGROUP.exists():
        return
    AUTOGROUP.write_text(f"{nice}\n")
