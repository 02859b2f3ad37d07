"""What a server process does once Django is set up (config/asgi.py, config/wsgi.py): load the local
embedding model, the tokenizers and the retrieval indexes of the most recently active conversations in the
background (so the first calls after a restart do not each pay for them; /readyz says "pending" meanwhile),
and in the embedded mode, where there is no broker and so no beat
process, run the periodic tasks of CELERY_BEAT_SCHEDULE itself (the vector sweep that picks up messages
left without vectors by a restart, the compaction catch-up, the task-state fold, the image purge), each queued
to the embedded mode's background worker (providers.background) at its interval, the first time shortly
after start."""

import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings

from providers.background import task_send
from providers.embeddings import embeddings_warm

logger = logging.getLogger(__name__)

# The first round waits this long, so a starting server answers its first requests first.
EMBEDDED_BEAT_DELAY_SECONDS = 5.0


def server_started() -> None:
    malloc_arenas_cap(settings.MNEMO_MALLOC_ARENAS)
    embeddings_warm()  # the first context call does not wait for the model
    caches_warm()
    if embedded_beat_enabled():
        EmbeddedBeat(settings.CELERY_BEAT_SCHEDULE).start()


# mallopt's parameter number for the arena count (glibc's malloc.h).
M_ARENA_MAX = -8


def malloc_arenas_cap(arenas: int) -> bool:
    """Cap glibc's malloc arenas at `arenas` (0: leave glibc's default). glibc gives each thread that meets a
    busy arena one of its own, up to eight per core, and hands little of their freed memory back, so a server
    whose request threads allocate large buffers (vectors, tokenizer output, numpy arrays) grows for as long
    as it serves. The threads mostly hold the GIL, so few arenas cost them little waiting. Called before the
    request threads start; returns whether glibc took it (False on another C library)."""
    if arenas <= 0:
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError):  # a C library without mallopt (macOS): nothing to cap
        return False
    return bool(mallopt(M_ARENA_MAX, arenas) == 1)


def caches_warm() -> threading.Thread | None:
    """On a background thread: import the chat proxy's client package and load the shipped tokenizers (both
    slow to load), then build the retrieval index of each of the MNEMO_WARM_CONVERSATIONS most recently
    active conversations (a long one is slow to build: in a fresh server, the slowest calls were
    conversations' first). None when MNEMO_WARM_ON_START is off."""
    if not settings.MNEMO_WARM_ON_START:
        return None
    count = min(settings.MNEMO_WARM_CONVERSATIONS, settings.MNEMO_RECALL_INDEX_CONVERSATIONS)
    _warm_done.clear()
    _warm_started.set()
    thread = threading.Thread(target=_caches_warm, args=(count,), name="mnemo-caches-warm", daemon=True)
    thread.start()
    return thread


_warm_started, _warm_done = threading.Event(), threading.Event()


def warm_state() -> str:
    """For /readyz: "pending" while caches_warm runs (a load balancer then sends this process nothing yet),
    "ok" when it has finished, "off" when it was not started."""
    if not _warm_started.is_set():
        return "off"
    return "ok" if _warm_done.is_set() else "pending"


def _caches_warm(count: int) -> None:
    from django.db import DatabaseError, connection

    from context.proxy.upstream import client_package_load
    from conversations.models import Conversation
    from providers.tokens import SHIPPED_ENCODINGS, get_encoding
    from retrieval.history import conversation_index

    try:
        client_package_load()
        for name in SHIPPED_ENCODINGS:
            get_encoding(name)
        recent = Conversation.objects.filter(archived_at__isnull=True).order_by("-updated_at")
        for conversation_id in recent.values_list("pk", flat=True)[:count]:
            conversation_index(conversation_id)
    except DatabaseError as exc:  # not migrated yet, or the database is away: the first calls build them
        logger.warning("warming the retrieval indexes stopped: %s", exc)
    finally:
        connection.close()
        _warm_done.set()


def embedded_beat_enabled() -> bool:
    """Eager Celery with tasks run beside the requests is the embedded mode: nothing else runs the beat."""
    return bool(
        settings.MNEMO_EMBEDDED_BEAT
        and settings.CELERY_TASK_ALWAYS_EAGER
        and settings.MNEMO_EAGER_TASKS_IN_THREAD
    )


def interval_seconds(schedule: Any) -> float | None:
    """A beat entry's interval: seconds or a timedelta (a crontab is left to a real beat: None)."""
    if isinstance(schedule, timedelta):
        return schedule.total_seconds()
    if isinstance(schedule, int | float) and schedule > 0:
        return float(schedule)
    return None


class EmbeddedBeat(threading.Thread):
    """Queues each periodic task whose time has come (task_send: the embedded mode's worker runs it), then
    sleeps until the next one is due."""

    def __init__(
        self,
        schedule: dict[str, dict[str, Any]],
        *,
        send: Callable[[Any], bool] = task_send,
        delay: float = EMBEDDED_BEAT_DELAY_SECONDS,
    ) -> None:
        super().__init__(name="mnemo-embedded-beat", daemon=True)
        self.intervals = {
            entry["task"]: seconds
            for entry in schedule.values()
            if (seconds := interval_seconds(entry.get("schedule"))) is not None
        }
        self.send = send
        self.due = dict.fromkeys(self.intervals, time.monotonic() + delay)
        self.stopped = threading.Event()
        self.tasks_imported = False

    def tick(self, now: float) -> list[str]:
        """Queue the tasks due at `now`; returns their names."""
        from config.celery import app

        if not self.tasks_imported:  # the apps' tasks modules: autodiscovery is lazy
            app.loader.import_default_modules()
            self.tasks_imported = True
        sent = []
        for name, due in self.due.items():
            if now < due:
                continue
            self.due[name] = now + self.intervals[name]
            try:
                self.send(app.tasks[name])
                sent.append(name)
            except Exception:  # a task that is not registered, or a send that failed: the next round tries
                logger.exception("embedded beat could not queue %s", name)
        return sent

    def run(self) -> None:
        while self.due:
            wait = max(0.0, min(self.due.values()) - time.monotonic())
            if self.stopped.wait(wait):
                return
            self.tick(time.monotonic())
