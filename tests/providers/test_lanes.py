"""A background request steps aside while a foreground call runs in its process, within its budget; nothing
else ever waits: a foreground call, work outside the lanes, or a process with no foreground call."""

import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from providers import lanes
from providers.embeddings import EMBED_BATCH, Embedder, embed_by_length
from providers.metrics import BACKGROUND_YIELD_SECONDS

REPO = Path(__file__).resolve().parents[2]


def yielded_seconds() -> float:
    return BACKGROUND_YIELD_SECONDS._value.get()


def test_nothing_waits_while_no_foreground_call_runs():
    with lanes.background(5.0):
        assert lanes.step_aside() == 0.0


def test_work_outside_the_lanes_never_waits():
    with lanes.foreground():
        assert lanes.step_aside() == 0.0  # the foreground call itself
    release = threading.Event()
    holder = threading.Thread(target=_hold_foreground, args=(release,))
    holder.start()
    try:
        _wait_for_foreground()
        assert lanes.step_aside() == 0.0  # no lane: a task, a command, a beside read
    finally:
        release.set()
        holder.join()


def test_a_background_request_waits_until_the_foreground_call_ends():
    release = threading.Event()
    holder = threading.Thread(target=_hold_foreground, args=(release,))
    holder.start()
    _wait_for_foreground()
    threading.Timer(0.2, release.set).start()
    before = yielded_seconds()
    with lanes.background(5.0):
        waited = lanes.step_aside()
    holder.join()

    assert 0.15 <= waited < 5.0
    assert lanes.foreground_calls() == 0
    assert yielded_seconds() - before >= waited - 1e-9


def test_the_budget_bounds_the_waits_of_a_request_in_all():
    release = threading.Event()
    holder = threading.Thread(target=_hold_foreground, args=(release,))
    holder.start()
    _wait_for_foreground()
    try:
        with lanes.background(0.2):
            first = lanes.step_aside()
            second = lanes.step_aside()  # the budget is spent: it goes on at once
    finally:
        release.set()
        holder.join()

    assert 0.15 <= first < 1.0
    assert second == 0.0


def test_a_foreground_call_begun_in_the_background_lane_does_not_step_aside():
    release = threading.Event()
    holder = threading.Thread(target=_hold_foreground, args=(release,))
    holder.start()
    _wait_for_foreground()
    try:
        with lanes.background(5.0), lanes.foreground():
            assert lanes.step_aside() == 0.0
    finally:
        release.set()
        holder.join()


def _hold_foreground(release: threading.Event) -> None:
    with lanes.foreground():
        release.wait(10)


def _wait_for_foreground() -> None:
    deadline = time.monotonic() + 5
    while not lanes.foreground_calls():
        assert time.monotonic() < deadline
        time.sleep(0.005)


# --- across processes --------------------------------------------------------------------------------------

HOLDER = """
import sys, django
django.setup()
from providers import lanes
with lanes.foreground():
    print("holding", flush=True)
    sys.stdin.readline()
"""


@pytest.fixture
def board(settings, tmp_path):
    """A board of this test's own (it is named after MNEMO_VAR_DIR)."""
    settings.VAR_DIR = tmp_path.resolve()
    yield lanes.host_board_path()
    lanes.host_board_path().unlink(missing_ok=True)


def test_a_foreground_call_marks_the_machines_board_while_it_runs(board):
    assert not lanes.host_foreground_busy()
    with lanes.foreground():
        assert lanes.host_foreground_busy()
        with lanes.foreground():
            pass
        assert lanes.host_foreground_busy()  # one call still runs
    assert not lanes.host_foreground_busy()
    assert lanes.host_step_aside(5.0) == 0.0


def test_background_work_waits_for_another_processs_foreground_call(board, settings):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.django.test",
        "MNEMO_VAR_DIR": str(settings.VAR_DIR),
    }
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        assert lanes.host_foreground_busy()
        assert lanes.host_step_aside(0.1) >= 0.1  # bounded: the call goes on
        threading.Timer(0.3, holder.communicate, kwargs={"input": "done\n"}).start()
        waited = lanes.host_step_aside(30.0)
        assert 0.2 <= waited < 30.0
        assert not lanes.host_foreground_busy()
    finally:
        holder.kill()
        holder.wait()


def test_a_mark_left_by_a_process_that_died_does_not_count(board):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with lanes.foreground():  # creates the board
        pass
    with open(board, "r+b") as raw:
        raw.seek((dead.pid % 256) * 8)
        raw.write(struct.pack("<II", dead.pid, 1))
    assert not lanes.host_foreground_busy()


def test_each_batch_embedded_waits_for_a_foreground_call_at_most_its_share(board, settings):
    settings.MNEMO_TASK_YIELD_MS = 100

    class Zeros(Embedder):
        dimension = 2

        def embed(self, texts: list[str]) -> np.ndarray:
            return np.zeros((len(texts), self.dimension), dtype=np.float32)

    before = yielded_seconds()
    with lanes.foreground():
        vectors = embed_by_length(Zeros(), ["a few words"] * (EMBED_BATCH + 1))  # two batches
    assert len(vectors) == EMBED_BATCH + 1
    assert 0.2 <= yielded_seconds() - before < 1.0
