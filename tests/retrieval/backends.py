"""`vector_backend`: a test run on each vector store, numpy (the default) and Milvus Lite in a file of this
session, the engine written by the receivers as the rows are (at once: a test's transaction never commits).
Imported by the conftest of the tests that use it."""

import pytest

from retrieval.vectors import follow
from retrieval.vectors.config import parse_vector_store
from retrieval.vectors.current import vector_store, vector_store_reset
from retrieval.vectors.milvus_store import literal
from retrieval.vectors.rows import DatabaseRows
from retrieval.vectors.store import KINDS


@pytest.fixture(scope="session")
def milvus_lite_uri(tmp_path_factory) -> str:
    return f"milvus://{tmp_path_factory.mktemp('engine') / 'vectors.db'}"


def _drop_collections() -> None:
    store = vector_store()
    if store.name != "milvus":
        return
    client = store._connected()  # type: ignore[attr-defined]
    for kind in KINDS:
        name = store.collection(kind)  # type: ignore[attr-defined]
        if client.has_collection(name):
            client.drop_collection(name)


@pytest.fixture(params=["numpy", "milvus"])
def vector_backend(request, settings, monkeypatch, milvus_lite_uri) -> str:
    settings.MNEMO_VECTOR_STORE = parse_vector_store("numpy" if request.param == "numpy" else milvus_lite_uri)
    monkeypatch.setattr(follow, "on_commit", lambda send, robust=False: send())
    vector_store_reset()
    yield request.param
    try:
        _drop_collections()
    finally:
        vector_store_reset()


def vectors_of_end_user(tenant_id, end_user_id) -> dict[str, int]:
    """How many vectors of each kind the process's store holds of this end user: the engine's own rows for
    Milvus, the database rows for numpy."""
    store = vector_store()
    if store.name == "numpy":
        rows = DatabaseRows()
        return {
            kind: sum(1 for _ in rows.load(kind, str(tenant_id), owner=str(end_user_id))) for kind in KINDS
        }
    client = store._connected()  # type: ignore[attr-defined]
    where = f"tenant_id == {literal(str(tenant_id))} and owner == {literal(str(end_user_id))}"
    out = {}
    for kind in KINDS:
        name = store.collection(kind)  # type: ignore[attr-defined]
        held = client.query(name, filter=where, output_fields=["pk"]) if client.has_collection(name) else []
        out[kind] = len(held)
    return out
