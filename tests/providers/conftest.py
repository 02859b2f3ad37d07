"""Fixtures for this folder: the OpenAI-compatible test server (tests/llm_server.py) and the embedded mode's
worker process with the test tasks (tests/providers/worker)."""

import pytest

from providers import background
from tests.llm_server import llm_server, llm_settings  # noqa: F401


@pytest.fixture
def worker(settings, monkeypatch):
    """Tasks run in the embedded worker's child process; what its echo task says is collected here."""
    settings.MNEMO_EAGER_TASKS_IN_THREAD = True
    settings.MNEMO_EMBEDDED_WORKER = "process"
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.providers.worker.settings")  # the child's
    heard: list = []
    background.server_handler("test_echo", heard.append)
    yield heard
    if background._worker is not None:
        background._worker.stop()
        background._worker = None
