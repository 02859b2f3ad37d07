"""A server process loads the local embedding model as it starts, on a background thread, so its first
context call does not wait for it; a context call embeds its question ahead, while it reads the database."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from providers import embeddings

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(embeddings._local_model_path() is None, reason="no local embedding model")


@pytest.fixture
def fresh_model(settings):
    settings.MNEMO_EMBEDDINGS = "local"
    embeddings._build.cache_clear()
    embeddings._query_cache.clear()
    embeddings.query_cache_scope_set("tenant-a")  # as an authenticated request is
    yield settings
    embeddings.query_cache_scope_set(None)
    embeddings._build.cache_clear()
    embeddings._query_cache.clear()


def test_warm_up_loads_and_runs_the_model_in_the_background(fresh_model, monkeypatch):
    fresh_model.MNEMO_WARM_ON_START = True
    runs: list[list[str]] = []
    original = embeddings.LocalMiniLM.embed
    monkeypatch.setattr(
        embeddings.LocalMiniLM, "embed", lambda self, texts: runs.append(texts) or original(self, texts)
    )
    thread = embeddings.embeddings_warm()
    assert thread is not None and thread.daemon
    thread.join(timeout=60)
    assert embeddings._build.cache_info().currsize == 1
    assert isinstance(embeddings.embedder_status().embedder, embeddings.LocalMiniLM)
    assert runs == [["warm up"]]  # the session has run once
    assert not embeddings._query_cache  # a query of no tenant is not kept


@pytest.mark.parametrize("setting, backend", [(False, "local"), (True, "none")])
def test_no_warm_up_when_turned_off(fresh_model, setting, backend):
    fresh_model.MNEMO_WARM_ON_START = setting
    fresh_model.MNEMO_EMBEDDINGS = backend
    assert embeddings.embeddings_warm() is None
    assert embeddings._build.cache_info().currsize == 0


def test_a_process_that_exits_while_the_model_loads_exits_cleanly(tmp_path):
    # Without the wait at exit, the interpreter stops the thread inside onnxruntime and the process aborts.
    script = (
        "import django; django.setup()\n"
        "from providers import embeddings\n"
        "import sys, time\n"
        "assert embeddings.embeddings_warm() is not None\n"
        "while 'onnxruntime' not in sys.modules: time.sleep(0.01)\n"
        "time.sleep(0.2)  # inside the session's native set-up\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.django.local",
        "MNEMO_VAR_DIR": str(tmp_path),
        "DJANGO_SECRET_KEY": "test",
        "MNEMO_EMBEDDINGS": "local",
        "MNEMO_WARM_ON_START": "true",
    }
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, "terminate called" in done.stderr) == (0, False), done.stderr[-2000:]


def test_a_query_embedded_ahead_is_picked_up_not_embedded_twice(fresh_model, monkeypatch):
    """The context pipeline starts embedding the question while it reads the database; the retrieve stage
    then waits for that vector instead of running the model again."""
    embedder = embeddings.embedder_status().embedder
    calls: list[list[str]] = []
    started, release = threading.Event(), threading.Event()
    original = embedder.embed

    def slow_embed(texts):
        calls.append(texts)
        started.set()
        release.wait(timeout=30)
        return original(texts)

    monkeypatch.setattr(embedder, "embed", slow_embed)
    embeddings.embed_query_ahead("Which port does staging listen on?")
    assert started.wait(timeout=30)  # running on the background thread
    embeddings.embed_query_ahead("Which port does staging listen on?")  # already under way: nothing new
    release.set()
    vector, model = embeddings.embed_query("Which port does staging listen on?")
    assert calls == [["Which port does staging listen on?"]]
    assert model == embedder.name and vector.shape == (embedder.dimension,)
    assert np.allclose(vector, original(["Which port does staging listen on?"])[0])


def test_nothing_is_embedded_ahead_without_the_local_model(fresh_model):
    fresh_model.MNEMO_EMBEDDINGS = "none"
    embeddings._build.cache_clear()
    embeddings.embed_query_ahead("Which port does staging listen on?")
    assert not embeddings._query_pending and not embeddings._query_cache
