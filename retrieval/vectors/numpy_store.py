"""The numpy backend: exact inner-product search in this process over vectors read from their database rows
(a loader per kind, retrieval.vectors.rows), kept per tenant and scope until a write of that tenant and kind
or until they are older than `cache_seconds`. The default; right while each search reads a bounded slice."""

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from retrieval.vectors.store import NO_FILTERS, Kind, VectorFilters, VectorHit, VectorRecord, VectorScope

# Another process's writes reach this one's cached slices after at most this long.
CACHE_SECONDS = 30.0
# Slices kept at once: a tenant-wide slice can be large, and the least recently searched go first.
CACHE_ENTRIES = 64


class Loader(Protocol):
    def load(
        self, kind: Kind, tenant_id: str, *, scopes: tuple[str, ...] | None = None, owner: str | None = None
    ) -> Iterable[VectorRecord]: ...

    def count(self, kind: Kind) -> int: ...


@dataclass(frozen=True)
class _Slice:
    """The vectors of one cache key: one row per record, in the loader's order."""

    ids: np.ndarray  # of str
    parts: np.ndarray
    scopes: np.ndarray  # of str
    owners: np.ndarray  # of str
    matrix: np.ndarray
    loaded_at: float

    @classmethod
    def of(cls, records: Iterable[VectorRecord], dimension: int) -> "_Slice":
        rows = list(records)
        matrix = np.zeros((len(rows), dimension), dtype=np.float32)
        for i, record in enumerate(rows):
            matrix[i] = record.vector
        return cls(
            ids=np.array([r.id for r in rows], dtype=object),
            parts=np.array([r.part for r in rows], dtype=np.int64),
            scopes=np.array([r.scope for r in rows], dtype=object),
            owners=np.array([r.owner for r in rows], dtype=object),
            matrix=matrix,
            loaded_at=time.monotonic(),
        )

    def allowed(self, filters: VectorFilters) -> np.ndarray | None:
        """The rows the filters let through (None: all of them)."""
        if not filters.narrows:
            return None
        mask = np.ones(len(self.ids), dtype=bool)
        if filters.scopes is not None:
            mask &= np.isin(self.scopes, list(filters.scopes))
        if filters.exclude_scopes:
            mask &= ~np.isin(self.scopes, list(filters.exclude_scopes))
        if filters.owner is not None:
            mask &= self.owners == filters.owner
        if filters.ids is not None:
            mask &= np.isin(self.ids, list(filters.ids))
        return mask

    def best(self, vector: np.ndarray, k: int, filters: VectorFilters) -> list[VectorHit]:
        if not len(self.ids):
            return []
        scores = self.matrix @ vector
        mask = self.allowed(filters)
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        take = min(k, len(scores))
        top = np.argpartition(-scores, take - 1)[:take] if take < len(scores) else np.arange(len(scores))
        return [
            VectorHit(str(self.ids[i]), float(scores[i]), int(self.parts[i]), str(self.scopes[i]))
            for i in top
            if np.isfinite(scores[i])
        ]


class NumpyVectorStore:
    name = "numpy"

    def __init__(
        self,
        loader: Loader,
        *,
        dimension: int,
        cache_seconds: float = CACHE_SECONDS,
        cache_entries: int = CACHE_ENTRIES,
    ) -> None:
        self.loader = loader
        self.dimension = dimension
        self.cache_seconds = cache_seconds
        self.cache_entries = cache_entries
        self._cache: OrderedDict[tuple[str, ...], _Slice] = OrderedDict()
        self._lock = threading.Lock()
        # Bumped by each write of a (kind, tenant): a slice read before a write is not kept after it.
        self._generation: dict[tuple[str, str], int] = {}

    # The database rows are the store: a write only drops what this process cached of that tenant and kind.
    def add(self, records: Sequence[VectorRecord]) -> None:
        for kind, tenant_id in {(r.kind, r.tenant_id) for r in records}:
            self._invalidate(kind, tenant_id)

    def delete(self, scope: VectorScope, filters: VectorFilters) -> None:
        self._invalidate(scope.kind, scope.tenant_id)

    def search(
        self, scope: VectorScope, vector: np.ndarray, k: int, filters: VectorFilters = NO_FILTERS
    ) -> list[VectorHit]:
        if k <= 0:
            return []
        query = np.asarray(vector, dtype=np.float32)
        hits: list[VectorHit] = []
        for piece in self._slices(scope, filters):
            hits.extend(piece.best(query, k, filters))
        # Best first; equal scores in a fixed order (row, then passage) so a search is repeatable.
        hits.sort(key=lambda h: (-h.score, h.id, h.part))
        return hits[:k]

    def present(self, kind: Kind, keys: Sequence[str]) -> set[str]:
        return set(keys)

    def count(self, kind: Kind) -> int:
        return self.loader.count(kind)

    def state(self) -> str:
        return "ok"

    def close(self) -> None:
        with self._lock:
            self._cache.clear()

    def _slices(self, scope: VectorScope, filters: VectorFilters) -> list[_Slice]:
        """Scoped searches read (and keep) each scope on its own, so a conversation's search never loads
        the tenant; an end user's search reads that end user's vectors; anything else the tenant's."""
        base = (scope.kind, scope.tenant_id)
        if filters.scopes is not None:
            return [
                self._slice((*base, "scope", s), scope, scopes=(s,), owner=None)
                for s in sorted(set(filters.scopes))
            ]
        if filters.owner is not None:
            return [self._slice((*base, "owner", filters.owner), scope, scopes=None, owner=filters.owner)]
        return [self._slice((*base, "all"), scope, scopes=None, owner=None)]

    def _slice(
        self, key: tuple[str, ...], scope: VectorScope, *, scopes: tuple[str, ...] | None, owner: str | None
    ) -> _Slice:
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and time.monotonic() - cached.loaded_at < self.cache_seconds:
                self._cache.move_to_end(key)
                return cached
            generation = self._generation.get((scope.kind, scope.tenant_id), 0)
        fresh = _Slice.of(
            self.loader.load(scope.kind, scope.tenant_id, scopes=scopes, owner=owner), self.dimension
        )
        with self._lock:
            if self._generation.get((scope.kind, scope.tenant_id), 0) != generation:
                return fresh
            self._cache[key] = fresh
            while len(self._cache) > self.cache_entries:
                self._cache.popitem(last=False)
        return fresh

    def _invalidate(self, kind: str, tenant_id: str) -> None:
        with self._lock:
            self._generation[(kind, tenant_id)] = self._generation.get((kind, tenant_id), 0) + 1
            for key in [key for key in self._cache if key[:2] == (kind, tenant_id)]:
                del self._cache[key]
