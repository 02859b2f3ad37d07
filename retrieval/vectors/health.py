"""The vector engine's state for /readyz. An engine that is down does not make the process unready: retrieval
then runs on words alone and says so, so the check reports "degraded" rather than a failure."""

from retrieval.vectors.current import vector_store


def vector_store_check() -> str:
    """ "ok (numpy)", "ok (milvus)" or "degraded (milvus unavailable)"."""
    store = vector_store()
    state = store.state()
    if state == "ok":
        return f"ok ({store.name})"
    return f"degraded ({store.name} {state})"
