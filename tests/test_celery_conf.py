"""tests.celery_conf gives the app's configuration back to Django's settings."""

from config.celery import app
from tests.celery_conf import celery_conf_changed


def test_after_a_change_the_settings_reach_the_app_again(settings):
    with celery_conf_changed(task_always_eager=False):
        assert app.conf.task_always_eager is False
    settings.CELERY_TASK_ALWAYS_EAGER = False
    assert app.conf.task_always_eager is False
    settings.CELERY_TASK_ALWAYS_EAGER = True
    assert app.conf.task_always_eager is True
    assert "task_always_eager" not in app.conf.changes


def test_an_earlier_change_is_put_back():
    with celery_conf_changed(broker_url="memory://outer"):
        with celery_conf_changed(broker_url="memory://inner"):
            assert app.conf.broker_url == "memory://inner"
        assert app.conf.broker_url == "memory://outer"
    assert "broker_url" not in app.conf.changes
