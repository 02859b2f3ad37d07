"""Celery's process-wide "get() would block" flag, which eager tasks overlapping on two threads leave set
(tests/conftest.py clears it before each test): a test that calls get() on a result must not depend on which
tests ran before it in the same process."""

import threading

from celery._state import task_join_will_block

from config.celery import app

_first_running, _second_running, _first_done = threading.Event(), threading.Event(), threading.Event()


@app.task(name="tests.test_celery_join_flag.overlap")
def overlap(which: str) -> str:
    """The first task ends while the second runs; the second ends after it."""
    if which == "first":
        _first_running.set()
        _second_running.wait(10)
    else:
        _second_running.set()
        _first_done.wait(10)
    return which


def _first() -> None:
    overlap.delay("first")
    _first_done.set()


def test_overlapping_eager_tasks_on_two_threads_leave_the_flag_set():
    """Why the fixture exists; Celery's own behaviour, checked so that a Celery without it is noticed."""
    assert app.conf.task_always_eager
    first = threading.Thread(target=_first)
    first.start()
    assert _first_running.wait(10)
    second = threading.Thread(target=overlap.delay, args=("second",))
    second.start()
    first.join(10)
    second.join(10)
    assert task_join_will_block()


def test_the_next_test_starts_with_the_flag_clear():
    assert not task_join_will_block()
    assert overlap.delay("second").get() == "second"  # _first_done is set: it returns at once
