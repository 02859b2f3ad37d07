"""The vector-store interface: what a record and a hit are, and the operations every backend offers.
The tenant and the kind are part of every call: no filter a caller passes reaches another tenant's vectors."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

Kind = Literal["message", "chunk", "memory"]
# message: a passage of a message (conversations.MessageVector, one row per message, a vector per passage);
# chunk: a knowledge chunk (knowledge.Chunk.embedding); memory: an archival memory (memory.ArchivalMemory).
KINDS: tuple[Kind, ...] = ("message", "chunk", "memory")


class VectorStoreUnavailable(Exception):
    """The engine cannot be reached or failed: callers fall back to lexical retrieval and report a
    degradation, never an error to the client."""


@dataclass(frozen=True)
class VectorRecord:
    """One vector. `scope` is what searches narrow to: the conversation of a message, the knowledge scope key
    of a chunk, the end user of a memory. `owner` is the end user whose data it is ("" for none), so an
    end user's delete removes every vector of theirs. `part` numbers the passages of one message."""

    kind: Kind
    tenant_id: str
    scope: str
    id: str
    vector: np.ndarray = field(compare=False, repr=False)
    part: int = 0
    owner: str = ""

    @property
    def key(self) -> str:
        return record_key(self.id, self.part)


def record_key(item_id: str, part: int) -> str:
    """The primary key of a vector in a store: the row it belongs to and its passage."""
    return f"{item_id}#{part}"


@dataclass(frozen=True)
class VectorScope:
    """What every operation is confined to: one kind of vector of one tenant."""

    kind: Kind
    tenant_id: str


@dataclass(frozen=True)
class VectorFilters:
    """Narrowing inside a VectorScope; every field left empty narrows nothing. `scopes`: only these scopes;
    `exclude_scopes`: none of these (the end user's other conversations); `owner`: one end user's vectors;
    `ids`: these rows only (a message, a document's chunks)."""

    scopes: tuple[str, ...] | None = None
    exclude_scopes: tuple[str, ...] = ()
    owner: str | None = None
    ids: tuple[str, ...] | None = None

    @property
    def narrows(self) -> bool:
        return (
            self.scopes is not None
            or bool(self.exclude_scopes)
            or self.owner is not None
            or self.ids is not None
        )


NO_FILTERS = VectorFilters()


@dataclass(frozen=True)
class VectorHit:
    """A search result: the row (and passage) and its inner product with the query (cosine similarity, the
    vectors being normalised), best first."""

    id: str
    score: float
    part: int = 0
    scope: str = ""


class VectorStore(Protocol):
    """A backend. Writes are idempotent (a record added twice is stored once); a search returns at most
    `k` hits of the scope's tenant and kind that match the filters. Any call may raise
    VectorStoreUnavailable."""

    name: str

    def add(self, records: Sequence[VectorRecord]) -> None: ...

    def delete(self, scope: VectorScope, filters: VectorFilters) -> None: ...

    def search(
        self, scope: VectorScope, vector: np.ndarray, k: int, filters: VectorFilters = NO_FILTERS
    ) -> list[VectorHit]: ...

    def present(self, kind: Kind, keys: Sequence[str]) -> set[str]:
        """Which of these record keys the store holds (any tenant): what a resumed migration skips."""
        ...

    def count(self, kind: Kind) -> int:
        """How many vectors of this kind the store holds, over every tenant (operations only)."""
        ...

    def state(self) -> str:
        """The engine's state for /readyz: "ok", or why it is not."""
        ...

    def close(self) -> None: ...


def forget_end_user(store: VectorStore, *, tenant_id: str, end_user_id: str) -> None:
    """An end user's data delete: every vector of theirs, of every kind."""
    for kind in KINDS:
        store.delete(VectorScope(kind, tenant_id), VectorFilters(owner=end_user_id))
