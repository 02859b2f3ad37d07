"""The store this process uses, made once from the MNEMO_VECTOR_STORE setting."""

import threading

from django.conf import settings

from retrieval.vectors.config import VectorStoreConfig, parse_vector_store
from retrieval.vectors.milvus_store import MilvusVectorStore
from retrieval.vectors.numpy_store import NumpyVectorStore
from retrieval.vectors.rows import DIMENSION, DatabaseRows
from retrieval.vectors.store import VectorStore

_store: VectorStore | None = None
_store_config: VectorStoreConfig | None = None
_lock = threading.Lock()


def store_from_config(config: VectorStoreConfig, *, dimension: int = DIMENSION) -> VectorStore:
    if config.backend == "numpy":
        return NumpyVectorStore(DatabaseRows(dimension), dimension=dimension)
    return MilvusVectorStore(config.uri, token=config.token, dimension=dimension)


def vector_store() -> VectorStore:
    """This process's store, as MNEMO_VECTOR_STORE names it (made again when a test changes the setting)."""
    global _store, _store_config
    config = settings.MNEMO_VECTOR_STORE
    if isinstance(config, str):
        config = parse_vector_store(config)
    with _lock:
        if _store is None or config != _store_config:
            if _store is not None:
                _store.close()
            _store, _store_config = store_from_config(config), config
        return _store


def vector_engine() -> VectorStore | None:
    """The store when it is an engine apart from the database (Milvus), which searches ask and writes
    follow; None for the numpy backend, whose truth is the database rows that each search already ranks
    exactly in this process (retrieval.knowledge's index, retrieval.archival's scan): no extra work there."""
    store = vector_store()
    return None if store.name == "numpy" else store


def vector_store_reset() -> None:
    global _store, _store_config
    with _lock:
        if _store is not None:
            _store.close()
        _store, _store_config = None, None
