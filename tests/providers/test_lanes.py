"""A background request steps aside while a foreground call runs in its process, within its budget; nothing
else ever waits: a foreground call, work outside the lanes, or a process with no foreground call."""

import threading

from providers import lanes
from providers.metrics import BACKGROUND_YIELD_SECONDS


def yielded_seconds() -> float:
    return BACKGROUND_YIELD_SECONDS._value.get()


def test_nothing_waits_while_no_foreground_call_runs():
    with lanes.background(5.0):
        assert lanes.step_aside() == 0.0


def test_work_outside_the_lanes_never_waits(held):
    assert lanes.step_aside() == 0.0  # no lane: a task, a command, a read beside a foreground call


def test_a_background_request_waits_until_the_foreground_call_ends(held):
    threading.Timer(0.2, held.set).start()
    before = yielded_seconds()
    with lanes.background(5.0):
        waited = lanes.step_aside()

    assert 0.15 <= waited < 5.0
    assert held.is_set()
    assert yielded_seconds() - before >= waited - 1e-9


def test_the_budget_bounds_the_waits_of_a_request_in_all(held):
    with lanes.background(0.2):
        first = lanes.step_aside()
        second = lanes.step_aside()  # the budget is spent: it goes on at once

    assert 0.15 <= first < 1.0
    assert second == 0.0
    assert not held.is_set()


def test_a_foreground_call_never_waits_for_another_even_begun_in_the_background_lane(held):
    with lanes.background(5.0), lanes.foreground():
        assert lanes.step_aside() == 0.0
