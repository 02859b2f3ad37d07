"""Background processes run below the server's CPU priority (MNEMO_BACKGROUND_NICE): the embedded worker's
child and a Celery worker (its worker_init signal, inherited by the pool processes it forks)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from providers.background import AUTOGROUP, background_join, background_priority_lower, task_send
from tests.providers.worker.tasks import echo

REPO = Path(__file__).resolve().parents[2]


def nice_of(pid: int) -> int:
    """The niceness of a running process (field 19 of /proc/PID/stat)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_the_embedded_workers_child_runs_at_a_lower_priority(worker):
    task_send(echo, "priority")
    background_join()

    child = worker[0][0]
    assert child != os.getpid()
    assert nice_of(child) == min(19, nice_of(os.getpid()) + 10)


def worker_init_nice(nice: str, *, session_of_its_own: bool = False) -> int:
    """A fresh process sends Celery's worker_init, as a starting worker does; its niceness afterwards."""
    return int(worker_init_prints(nice, "os.nice(0)", session_of_its_own=session_of_its_own))


def worker_init_prints(nice: str, expression: str, *, session_of_its_own: bool = False) -> str:
    code = (
        "import os, django; django.setup(); from celery.signals import worker_init; "
        f"worker_init.send(sender=None); print({expression})"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.django.test", "MNEMO_BACKGROUND_NICE": nice}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        start_new_session=session_of_its_own,
    )
    return done.stdout.strip().splitlines()[-1]


def autogroup_nice(text: str) -> int:
    """The niceness in /proc/PID/autogroup ("/autogroup-12 nice 0")."""
    return int(text.split()[-1])


needs_autogroup = pytest.mark.skipif(not AUTOGROUP.exists(), reason="no autogroup in this kernel")
AUTOGROUP_READ = "open('/proc/self/autogroup').read()"


@needs_autogroup
def test_a_worker_leading_its_own_session_lowers_its_session_too():
    """Linux shares the CPU between sessions before it weighs a niceness: a worker alone in its session
    lowers that session's weight, or it takes as much CPU as the server."""
    printed = worker_init_prints("7", AUTOGROUP_READ, session_of_its_own=True)
    assert autogroup_nice(printed) == min(19, nice_of(os.getpid()) + 7)


@needs_autogroup
def test_a_worker_sharing_the_servers_session_leaves_the_session_alone():
    """The same group at the same niceness. A session that never had a group of its own (a container's, or
    one started at boot) reads as an empty line: Linux shows no group for the default one."""
    ours = AUTOGROUP.read_text()
    assert worker_init_prints("7", f"repr({AUTOGROUP_READ})") == repr(ours)


def test_a_celery_worker_lowers_its_priority_as_it_starts():
    assert worker_init_nice("7") == min(19, nice_of(os.getpid()) + 7)


def test_nice_zero_leaves_the_priority_as_it_was():
    assert worker_init_nice("0") == nice_of(os.getpid())


def test_a_refused_change_is_logged_not_raised(settings, monkeypatch, caplog):
    def refuse(_increment):
        raise PermissionError("not permitted")

    monkeypatch.setattr(os, "nice", refuse)
    background_priority_lower()

    assert "background priority left as it was" in caplog.text
