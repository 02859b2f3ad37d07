"""Vector search behind one interface (store.py), with the numpy backend (exact, in process, the default)
and the Milvus backend (a server, a cluster or Milvus Lite), chosen by MNEMO_VECTOR_STORE (config.py);
the process's store is current.vector_store(). Imported by the settings (via config.py): loads no app."""

from retrieval.vectors.store import (
    KINDS,
    NO_FILTERS,
    Kind,
    VectorFilters,
    VectorHit,
    VectorRecord,
    VectorScope,
    VectorStore,
    VectorStoreUnavailable,
    forget_end_user,
)

__all__ = [
    "KINDS",
    "NO_FILTERS",
    "Kind",
    "VectorFilters",
    "VectorHit",
    "VectorRecord",
    "VectorScope",
    "VectorStore",
    "VectorStoreUnavailable",
    "forget_end_user",
]
