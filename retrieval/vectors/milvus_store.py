"""The Milvus backend (pymilvus): a Milvus server or cluster by URI, or Milvus Lite in a local file. One
collection per kind, the tenant as partition key, an HNSW index on inner product (vectors are normalised).
Every failure to reach or use the engine is a VectorStoreUnavailable, raised at once for a short while after
one, so a dead engine costs each request nothing and retrieval degrades to lexical."""

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from retrieval.vectors.store import (
    KINDS,
    NO_FILTERS,
    Kind,
    VectorFilters,
    VectorHit,
    VectorRecord,
    VectorScope,
    VectorStoreUnavailable,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Connect and per-call timeout: a request never waits on a dead engine longer than this.
TIMEOUT_SECONDS = 2.0
# After a failure, calls fail at once for this long before the engine is tried again.
RETRY_SECONDS = 5.0
LITE_GRPC_OPTIONS = {"grpc.keepalive_permit_without_calls": False}
# HNSW graph degree and build breadth, and the search breadth (at least k): recall against exact search
# rises with each, memory and latency too (bench/vector_store.py measures the trade).
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 200
SEARCH_EF = 256
WRITE_BATCH = 1000
# The longest ids and keys stored: a UUID with a passage number, a knowledge scope key.
KEY_LENGTH = 80
# What a search returns besides the score: never the vector, which would make every search slow.
HIT_FIELDS = ["item_id", "part", "scope"]
# A client reads its own writes (a receiver of this process added them) without waiting, on each search, for
# every node's clock as "Strong" does; another process's writes show within the engine's tick.
CONSISTENCY = "Session"


def literal(value: str) -> str:
    """A string as a Milvus expression literal: the value can never end the string and add a condition."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _in(field: str, values: Sequence[str]) -> str:
    return f"{field} in [{', '.join(literal(v) for v in values)}]"


def expression(scope: VectorScope, filters: VectorFilters) -> str:
    """The filter of a search or delete: always the tenant, then the caller's narrowing."""
    parts = [f"tenant_id == {literal(scope.tenant_id)}"]
    if filters.scopes is not None:
        parts.append(_in("scope", filters.scopes) if filters.scopes else "false")
    if filters.exclude_scopes:
        parts.append(f"not ({_in('scope', filters.exclude_scopes)})")
    if filters.owner is not None:
        parts.append(f"owner == {literal(filters.owner)}")
    if filters.ids is not None:
        parts.append(_in("item_id", filters.ids) if filters.ids else "false")
    return " and ".join(parts)


def _batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MilvusVectorStore:
    name = "milvus"

    def __init__(
        self,
        uri: str,
        *,
        dimension: int,
        token: str = "",
        prefix: str = "mnemo",
        timeout: float = TIMEOUT_SECONDS,
        retry_seconds: float = RETRY_SECONDS,
        hnsw_m: int = HNSW_M,
        ef_construction: int = HNSW_EF_CONSTRUCTION,
        search_ef: int = SEARCH_EF,
    ) -> None:
        self.uri = uri
        self.token = token
        self.dimension = dimension
        self.prefix = prefix
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.hnsw_m = hnsw_m
        self.ef_construction = ef_construction
        self.search_ef = search_ef
        self._client: Any = None
        self._ready: set[str] = set()
        self._down_until = 0.0
        self._lock = threading.RLock()

    # --- the interface ------------------------------------------------------------------------------------

    def add(self, records: Sequence[VectorRecord]) -> None:
        for kind in KINDS:
            rows = [self._row(r) for r in records if r.kind == kind]
            for batch in _batches(rows, WRITE_BATCH):
                self._upsert(kind, list(batch))

    def delete(self, scope: VectorScope, filters: VectorFilters) -> None:
        self._call(
            scope.kind,
            lambda client, name: client.delete(name, filter=expression(scope, filters), timeout=self.timeout),
        )

    def search(
        self, scope: VectorScope, vector: np.ndarray, k: int, filters: VectorFilters = NO_FILTERS
    ) -> list[VectorHit]:
        if k <= 0:
            return []
        query = np.asarray(vector, dtype=np.float32).tolist()
        params = {"metric_type": "IP", "params": {"ef": max(self.search_ef, k)}}
        found = self._call(
            scope.kind,
            lambda client, name: client.search(
                name,
                [query],
                limit=k,
                filter=expression(scope, filters),
                output_fields=HIT_FIELDS,
                search_params=params,
                consistency_level=CONSISTENCY,
                timeout=self.timeout,
            ),
        )
        hits = [
            VectorHit(
                hit["entity"]["item_id"],
                float(hit["distance"]),
                int(hit["entity"]["part"]),
                hit["entity"]["scope"],
            )
            for hit in found[0]
        ]
        hits.sort(key=lambda h: (-h.score, h.id, h.part))
        return hits

    def present(self, kind: Kind, keys: Sequence[str]) -> set[str]:
        out: set[str] = set()
        for batch in _batches(list(keys), WRITE_BATCH):
            out.update(self._present(kind, list(batch)))
        return out

    def count(self, kind: Kind) -> int:
        rows = self._call(
            kind,
            lambda client, name: client.query(
                name, filter="", output_fields=["count(*)"], timeout=self.timeout
            ),
        )
        return int(rows[0]["count(*)"])

    def flush(self, kind: Kind) -> None:
        """Seal what was written into indexed segments: after a bulk load, searches otherwise scan the
        unsealed rows one by one."""
        self._call(kind, lambda client, name: client.flush(name, timeout=self.timeout))

    def indexed(self, kind: Kind) -> tuple[int, int]:
        """(indexed rows, rows) of the kind's vector index: the engine builds it in the background after a
        flush, and until then searches the unindexed segments with a coarser interim index."""
        info = self._call(
            kind, lambda client, name: client.describe_index(name, "vector", timeout=self.timeout)
        )
        return int(info.get("indexed_rows", 0)), int(info.get("total_rows", 0))

    def state(self) -> str:
        try:
            self._connected()
        except VectorStoreUnavailable:
            return "unavailable"  # the reason is in the log, not in an unauthenticated probe's answer
        return "ok"

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            self._ready.clear()
        if client is not None:
            client.close()

    # --- the engine ---------------------------------------------------------------------------------------

    def collection(self, kind: Kind) -> str:
        return f"{self.prefix}_{kind}"

    def _upsert(self, kind: Kind, rows: list[dict[str, Any]]) -> None:
        """Replace these rows: delete their keys, then insert. Not the engine's upsert, which on servers of
        the 2.3 line with a partition key stored vectors under other keys (a search no longer found a vector
        by itself); delete and insert behave the same on every version and in Milvus Lite."""
        keys = [row["pk"] for row in rows]
        self._call(
            kind, lambda client, name: client.delete(name, filter=_in("pk", keys), timeout=self.timeout)
        )
        self._call(kind, lambda client, name: client.insert(name, rows, timeout=self.timeout))

    def _present(self, kind: Kind, keys: list[str]) -> set[str]:
        rows = self._call(
            kind,
            lambda client, name: client.query(
                name, filter=_in("pk", keys), output_fields=["pk"], limit=len(keys), timeout=self.timeout
            ),
        )
        return {row["pk"] for row in rows}

    def _row(self, record: VectorRecord) -> dict[str, Any]:
        return {
            "pk": record.key,
            "tenant_id": record.tenant_id,
            "scope": record.scope,
            "owner": record.owner,
            "item_id": record.id,
            "part": record.part,
            "vector": np.asarray(record.vector, dtype=np.float32).tolist(),
        }

    def _call(self, kind: Kind, operation: Callable[[Any, str], T]) -> T:
        client = self._connected()
        name = self.collection(kind)
        try:
            if name not in self._ready:
                self._prepare(client, kind)
            return operation(client, name)
        except VectorStoreUnavailable:
            raise
        except Exception as exc:
            raise self._failed(exc) from exc

    def _connected(self) -> Any:
        with self._lock:
            if self._client is not None:
                return self._client
            if time.monotonic() < self._down_until:
                raise VectorStoreUnavailable("engine down, not retried yet")
            try:
                self._client = _open(self.uri, self.token, self.timeout)
            except Exception as exc:
                raise self._failed(exc) from exc
            return self._client

    def _failed(self, exc: Exception) -> VectorStoreUnavailable:
        logger.warning("vector store %s failed: %r", self.uri, exc)
        with self._lock:
            self._down_until = time.monotonic() + self.retry_seconds
            client, self._client = self._client, None
            self._ready.clear()
        if client is not None:
            try:
                client.close()
            except Exception:  # already broken: nothing more to release
                logger.debug("closing a failed Milvus client", exc_info=True)
        return VectorStoreUnavailable(f"{type(exc).__name__}: {exc}")

    def _prepare(self, client: Any, kind: Kind) -> None:
        """Create the kind's collection when it is missing, and load it (a reopened Milvus Lite file holds
        its collections unloaded, and an unloaded collection cannot be searched)."""
        name = self.collection(kind)
        with self._lock:
            if not client.has_collection(name, timeout=self.timeout):
                try:
                    client.create_collection(
                        name,
                        schema=self._schema(client),
                        index_params=self._index(client),
                        consistency_level=CONSISTENCY,
                        timeout=self.timeout,
                    )
                except Exception:
                    # Another process created it first.
                    if not client.has_collection(name, timeout=self.timeout):
                        raise
            client.load_collection(name, timeout=self.timeout)
            self._ready.add(name)

    def _schema(self, client: Any) -> Any:
        from pymilvus import DataType  # optional: loaded only with the milvus backend, as in _open

        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=KEY_LENGTH + 12)
        schema.add_field("tenant_id", DataType.VARCHAR, max_length=KEY_LENGTH, is_partition_key=True)
        schema.add_field("scope", DataType.VARCHAR, max_length=KEY_LENGTH)
        schema.add_field("owner", DataType.VARCHAR, max_length=KEY_LENGTH)
        schema.add_field("item_id", DataType.VARCHAR, max_length=KEY_LENGTH)
        schema.add_field("part", DataType.INT32)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=self.dimension)
        return schema

    def _index(self, client: Any) -> Any:
        params = client.prepare_index_params()
        params.add_index(
            field_name="vector",
            index_type="HNSW",
            metric_type="IP",
            params={"M": self.hnsw_m, "efConstruction": self.ef_construction},
        )
        return params


def _open(uri: str, token: str, timeout: float) -> Any:
    # pymilvus (and Milvus Lite behind it) loads only when the milvus backend is configured: the numpy
    # default runs without either installed.
    from pymilvus import MilvusClient

    if uri.startswith("http"):
        return MilvusClient(uri=uri, token=token, timeout=timeout)
    # Milvus Lite's server refuses keepalive pings on a connection with no call in flight: after a quiet half
    # minute it sent GOAWAY (too_many_pings), and a search racing the reconnect found the engine down.
    return MilvusClient(uri, grpc_options=LITE_GRPC_OPTIONS)
