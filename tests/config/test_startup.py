"""A starting server: in the embedded mode (no broker, so no beat process) it runs the beat schedule's
periodic tasks itself, so messages left without vectors by a restart get them without a context call."""

from datetime import timedelta

import pytest
from celery.schedules import crontab

from config.startup import EmbeddedBeat, embedded_beat_enabled, interval_seconds
from conversations.models import MessageVector
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
