"""MNEMO_VECTOR_STORE parsing, the Milvus filter expressions, an engine that cannot be reached, and the state
/readyz reports."""

import socket
import time

import numpy as np
import pytest
from django.core.exceptions import ImproperlyConfigured

from retrieval.vectors.config import VectorStoreConfig, parse_vector_store
from retrieval.vectors.current import vector_store, vector_store_reset
from retrieval.vectors.health import vector_store_check
from retrieval.vectors.milvus_store import MilvusVectorStore, expression
from retrieval.vectors.store import VectorFilters, VectorRecord, VectorScope, VectorStoreUnavailable


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", VectorStoreConfig("numpy")),
        ("numpy", VectorStoreConfig("numpy")),
        ("milvus://milvus.internal:19530", VectorStoreConfig("milvus", uri="http://milvus.internal:19530")),
        ("milvus://vectors", VectorStoreConfig("milvus", uri="http://vectors:19530")),
        (
            "milvus://root:s%40cret@db:19531",
            VectorStoreConfig("milvus", uri="http://db:19531", token="root:s@cret"),
        ),
        ("milvus:///var/lib/mnemo/vectors.db", VectorStoreConfig("milvus", uri="/var/lib/mnemo/vectors.db")),
    ],
)
def test_the_setting_names_a_backend(raw, expected):
    assert parse_vector_store(raw) == expected


@pytest.mark.parametrize(
    "raw",
    ["faiss", "milvus", "milvus://host:port", "milvus:///relative.txt", "milvus:///.db", "http://host:19530",
     "milvus://host:19530/db?x=1"],
)  # fmt: skip
def test_a_bad_setting_stops_start_up(raw):
    with pytest.raises(ImproperlyConfigured):
        parse_vector_store(raw)


def test_a_filter_value_cannot_leave_its_string():
    scope = VectorScope("message", 't" or tenant_id != "')
    assert expression(scope, VectorFilters(scopes=('a\\" or true or "',), owner="o")) == (
        'tenant_id == "t\\" or tenant_id != \\"" and scope in ["a\\\\\\" or true or \\""] and owner == "o"'
    )
    assert expression(VectorScope("chunk", "t"), VectorFilters(scopes=(), ids=())) == (
        'tenant_id == "t" and false and false'
    )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_engine_fails_quickly_with_a_typed_error():
    store = MilvusVectorStore(f"http://127.0.0.1:{_closed_port()}", dimension=4, timeout=2.0)
    scope = VectorScope("memory", "t")
    started = time.monotonic()
    with pytest.raises(VectorStoreUnavailable):
        store.search(scope, np.ones(4, dtype=np.float32), k=3)
    assert time.monotonic() - started <= 2.5
    # Until the retry delay has passed, every call fails at once without trying the engine again.
    started = time.monotonic()
    for call in (
        lambda: store.add([VectorRecord("memory", "t", "s", "1", np.ones(4, dtype=np.float32))]),
        lambda: store.delete(scope, VectorFilters(owner="u")),
        lambda: store.count("memory"),
    ):
        with pytest.raises(VectorStoreUnavailable):
            call()
    assert time.monotonic() - started < 0.5
    assert store.state() == "unavailable"


def test_readiness_reports_the_engine(settings):
    try:
        settings.MNEMO_VECTOR_STORE = parse_vector_store("numpy")
        assert vector_store().name == "numpy"
        assert vector_store_check() == "ok (numpy)"
        settings.MNEMO_VECTOR_STORE = parse_vector_store(f"milvus://127.0.0.1:{_closed_port()}")
        assert vector_store().name == "milvus"
        assert vector_store_check() == "degraded (milvus unavailable)"
    finally:
        vector_store_reset()


def test_milvus_lite_reopened_is_searchable(tmp_path):
    path = str(tmp_path / "reopen.db")
    vector = np.zeros(4, dtype=np.float32)
    vector[2] = 1.0
    first = MilvusVectorStore(path, dimension=4)
    first.add([VectorRecord("chunk", "t", "tenant", "42", vector)])
    first.close()
    again = MilvusVectorStore(path, dimension=4)
    try:
        hits = again.search(VectorScope("chunk", "t"), vector, k=5)
        assert [(h.id, h.scope) for h in hits] == [("42", "tenant")]
        assert again.state() == "ok"
    finally:
        again.close()


def test_milvus_lite_is_opened_without_keepalive_pings_between_calls(tmp_path):
    """Milvus Lite's server answers pings on an idle connection with GOAWAY (too_many_pings)."""
    store = MilvusVectorStore(str(tmp_path / "idle.db"), dimension=4)
    try:
        options = dict(store._connected()._get_connection()._grpc_options)
        assert options == {"grpc.keepalive_permit_without_calls": False}
    finally:
        store.close()
