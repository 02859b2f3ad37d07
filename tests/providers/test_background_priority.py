"""Background processes run below the server's CPU priority (MNEMO_BACKGROUND_NICE): the embedded worker's
child and a Celery worker (its worker_init signal, inherited by the pool processes it forks)."""

import os
import subprocess
import sys
from pathlib import Path

from providers.background import background_join, background_priority_lower, task_send
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


def worker_init_nice(nice: str) -> int:
    """A fresh process sends Celery's worker_init, as a starting worker does; its niceness afterwards."""
    code = (
        "import os, django; django.setup(); from celery.signals import worker_init; "
        "worker_init.send(sender=None); print(os.nice(0))"
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
    )
    return int(done.stdout.strip().splitlines()[-1])


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
