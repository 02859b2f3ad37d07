"""A server process loads the local embedding model as it starts, on a background thread, so its first
context call does not wait for it."""

import pytest

from providers import embeddings

pytestmark = pytest.mark.skipif(embeddings._local_model_path() is None, reason="no local embedding model")


@pytest.fixture
def fresh_model(settings):
    settings.MNEMO_EMBEDDINGS = "local"
    embeddings._build.cache_clear()
    embeddings._query_cache.clear()
    yield settings
    embeddings._build.cache_clear()
    embeddings._query_cache.clear()


def test_warm_up_loads_and_runs_the_model_in_the_background(fresh_model):
    fresh_model.MNEMO_WARM_ON_START = True
    thread = embeddings.embeddings_warm()
    assert thread is not None and thread.daemon
    thread.join(timeout=60)
    assert embeddings._build.cache_info().currsize == 1
    assert isinstance(embeddings.embedder_status().embedder, embeddings.LocalMiniLM)
    assert embeddings._query_cache  # the session has run once


@pytest.mark.parametrize("setting, backend", [(False, "local"), (True, "none")])
def test_no_warm_up_when_turned_off(fresh_model, setting, backend):
    fresh_model.MNEMO_WARM_ON_START = setting
    fresh_model.MNEMO_EMBEDDINGS = backend
    assert embeddings.embeddings_warm() is None
    assert embeddings._build.cache_info().currsize == 0
