"""A starting server: in the embedded mode (no broker, so no beat process) it runs the beat schedule's
periodic tasks itself, so messages left without vectors by a restart get them without a context call."""

import platform
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
from celery.schedules import crontab

from config import startup
from config.startup import EmbeddedBeat, caches_warm, embedded_beat_enabled, interval_seconds, warm_state
from conversations.models import MessageVector
from conversations.services import conversation_create
from retrieval import history as history_index
from tests.summaries.helpers import append

SWEEP = "conversations.tasks.message_vectors_sweep"


def test_intervals_are_seconds_or_timedeltas_and_crontabs_are_left_to_a_real_beat():
    assert interval_seconds(600) == 600.0
    assert interval_seconds(timedelta(minutes=2)) == 120.0
    assert interval_seconds(crontab(minute=0)) is None
    assert interval_seconds(0) is None
    beat = EmbeddedBeat({"a": {"task": SWEEP, "schedule": 60}, "b": {"task": "x.y", "schedule": crontab()}})
    assert beat.intervals == {SWEEP: 60.0}


@pytest.mark.parametrize(
    "eager, in_thread, setting, expected",
    [
        (True, True, True, True),
        (True, True, False, False),
        (True, False, True, False),
        (False, True, True, False),
    ],
)
def test_only_the_embedded_mode_runs_its_own_beat(settings, eager, in_thread, setting, expected):
    settings.CELERY_TASK_ALWAYS_EAGER = eager
    settings.MNEMO_EAGER_TASKS_IN_THREAD = in_thread
    settings.MNEMO_EMBEDDED_BEAT = setting
    assert embedded_beat_enabled() is expected


@pytest.mark.django_db
def test_the_vector_sweep_runs_when_due_and_fills_what_a_restart_left(conversation, local_embeddings):
    append(conversation, {"role": "user", "content": "The staging database listens on port 6543."})
    assert not MessageVector.objects.filter(conversation=conversation).exists()  # no vectors on append here
    beat = EmbeddedBeat({"sweep": {"task": SWEEP, "schedule": 600}}, delay=0)
    start = min(beat.due.values())
    assert beat.tick(start) == [SWEEP]
    assert MessageVector.objects.filter(conversation=conversation).count() == 1
    assert beat.tick(start + 1) == []  # not due again before its interval
    assert beat.tick(start + 600) == [SWEEP]


def test_a_failing_send_is_tried_again_next_round():
    calls = []

    def send(task):
        calls.append(task.name)
        raise ConnectionError("broker down")

    beat = EmbeddedBeat({"sweep": {"task": SWEEP, "schedule": 10}}, send=send, delay=0)
    start = min(beat.due.values())
    assert beat.tick(start) == []  # logged, not raised: the beat thread lives on
    assert beat.tick(start + 10) == []
    assert calls == [SWEEP, SWEEP]


@pytest.mark.django_db(transaction=True)
def test_a_starting_server_builds_the_indexes_of_the_most_recently_active_conversations(
    owner, settings, monkeypatch
):
    """The first call of each conversation after a restart built its index in the request (~150-250 ms for
    a long one); a starting server builds them for the latest conversations in the background."""
    monkeypatch.setattr(startup, "_warm_started", threading.Event())  # this process's state, left as found
    monkeypatch.setattr(startup, "_warm_done", threading.Event())
    older, newer = (conversation_create(tenant=owner.tenant, end_user_external_id=u) for u in ("a", "b"))
    append(older, {"role": "user", "content": "The staging database listens on port 6543."})
    append(newer, {"role": "user", "content": "The deploy key rotates every ninety days."})
    history_index.conversation_index_drop(older.pk)
    history_index.conversation_index_drop(newer.pk)
    settings.MNEMO_WARM_ON_START = True
    settings.MNEMO_WARM_CONVERSATIONS = 1
    caches_warm().join(timeout=60)
    assert warm_state() == "ok"
    assert str(newer.pk) in history_index._indexes
    assert str(older.pk) not in history_index._indexes
    assert history_index._indexes[str(newer.pk)].indexed_seq == 1
    settings.MNEMO_WARM_ON_START = False
    assert caches_warm() is None


ARENAS_PROBE = """
import ctypes, ctypes.util, sys, threading
from config.startup import malloc_arenas_cap
print(malloc_arenas_cap(int(sys.argv[1])), flush=True)
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
together = threading.Barrier(8)  # alive at once, so none takes over an arena another one left


def allocate():
    libc.malloc(4096)
    together.wait()


threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
libc.malloc_stats()  # one "Arena N:" block per arena, to stderr
"""


def arenas_used(cap: int) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", ARENAS_PROBE, str(cap)], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.strip(), done.stderr.count("Arena ")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")
def test_a_server_caps_malloc_arenas_so_its_threads_share_them():
    taken, arenas = arenas_used(0)
    assert taken == "False"
    assert arenas > 2  # glibc's default: each new thread gets an arena of its own
    assert arenas_used(2) == ("True", 2)
