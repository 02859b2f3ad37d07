"""The local embedding model runs with int8 arithmetic: derived once from the shipped model into the var
directory, close to it in what it says, under a model name of its own; the shipped model serves when the
derivation is off or cannot be built."""

import builtins
from pathlib import Path

import numpy as np
import pytest

from providers import embeddings, quantize

pytestmark = pytest.mark.skipif(embeddings._local_model_path() is None, reason="no local embedding model")

SENTENCES = [
    "I switched the nightly export to run at 2 am because of the storage timeouts.",
    "My daughter starts violin lessons on Tuesdays.",
    "Can you explain how the retry budget interacts with the circuit breaker?",
]


@pytest.fixture
def shipped() -> Path:
    return Path(embeddings._local_model_path())


@pytest.fixture
def fresh_model(settings, tmp_path):
    settings.MNEMO_EMBEDDINGS = "local"
    settings.VAR_DIR = tmp_path
    embeddings._build.cache_clear()
    yield settings
    embeddings._build.cache_clear()


def test_built_once_then_reused(shipped, tmp_path):
    built = quantize.dynamic_int8(shipped, tmp_path / "models")
    assert built is not None and built.parent == tmp_path / "models"
    assert [p.name for p in built.parent.iterdir()] == [built.name]  # no build leftovers
    stamp = built.stat().st_mtime_ns
    assert quantize.dynamic_int8(shipped, tmp_path / "models") == built
    assert built.stat().st_mtime_ns == stamp


def test_int8_vectors_stay_close_to_the_shipped_models(fresh_model, shipped):
    int8 = embeddings._local_embedder(str(shipped))
    assert int8.name == embeddings.INT8_NAME
    original = embeddings.LocalMiniLM(str(shipped))
    assert original.name == "all-MiniLM-L6-v2-onnx-int8"
    a, b = int8.embed(SENTENCES), original.embed(SENTENCES)
    assert not np.array_equal(a, b)  # another computation…
    assert np.all((a * b).sum(axis=1) > 0.98)  # …of the same meaning
    assert np.argmax(a[:2] @ a[2]) == np.argmax(b[:2] @ b[2])


def test_turned_off_the_shipped_model_serves(fresh_model, shipped):
    fresh_model.MNEMO_EMBEDDINGS_INT8 = False
    assert embeddings.embedder_status().embedder.name == "all-MiniLM-L6-v2-onnx-int8"
    assert not (fresh_model.VAR_DIR / "models").exists()


def test_without_onnx_the_shipped_model_serves(fresh_model, monkeypatch, caplog):
    real_import = builtins.__import__

    def no_onnx(name, *args, **kwargs):
        if name == "onnx" or name.startswith("onnxruntime.quantization"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnx)
    status = embeddings.embedder_status()
    assert status.embedder.name == "all-MiniLM-L6-v2-onnx-int8" and status.reason == ""
    assert "int8 embedding model not built" in caplog.text


def test_a_model_it_cannot_quantise_leaves_no_file(tmp_path, caplog):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    assert quantize.dynamic_int8(broken, tmp_path / "models") is None
    assert list((tmp_path / "models").iterdir()) == []
    assert "int8 embedding model not built" in caplog.text
