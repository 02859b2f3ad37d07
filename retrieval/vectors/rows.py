"""The vectors as the database holds them today (blobs of float32 via providers.embeddings): read per kind
for one tenant, narrowed by scope or end user (the numpy store's loader), or in batches over every tenant
(vectors_migrate). The database stays the source of truth; a Milvus collection is a copy of these rows."""

from collections.abc import Iterable, Iterator
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from conversations.models import MessageVector
from knowledge.models import Chunk
from memory.models import ArchivalMemory
from providers.embeddings import from_bytes
from retrieval.vectors.store import Kind, VectorRecord

DIMENSION = 384  # the local embedding model's (providers.embeddings)
READ_CHUNK = 2000


def _rows(kind: Kind) -> QuerySet[Any, Any]:
    """Every row of the kind that carries a vector a search may return, as value tuples
    (id, tenant, scope, owner, vectors), a message's with the dimension of its blob of passage vectors."""
    if kind == "message":
        return MessageVector.objects.values_list(
            "message_id", "conversation__tenant_id", "conversation_id", "conversation__end_user_id",
            "vectors", "dimension",
        )  # fmt: skip
    if kind == "chunk":
        # A document uploaded for one end user is theirs: their data delete removes its chunks.
        return Chunk.objects.filter(embedding__isnull=False).values_list(
            "id", "tenant_id", "scope_key", "document__end_user_id", "embedding"
        )
    # A memory that a newer fact invalidated is kept for the record but never retrieved.
    return ArchivalMemory.objects.filter(invalidated_at__isnull=True, embedding__isnull=False).values_list(
        "id", "tenant_id", "end_user_id", "end_user_id", "embedding"
    )


def _narrowed(
    kind: Kind, tenant_id: str, scopes: tuple[str, ...] | None, owner: str | None
) -> QuerySet[Any, Any]:
    """The tenant's rows of the kind, in these scopes and of this owner when given. A value that is not a
    key of its column (a conversation scope that is no UUID) matches nothing, as it would in any engine."""
    scope_field, owner_field = _NARROWING[kind]
    rows = _rows(kind).filter(**{f"{_TENANT[kind]}__in": _valid(_TENANT[kind], kind, (tenant_id,))})
    if scopes is not None:
        rows = rows.filter(**{f"{scope_field}__in": _valid(scope_field, kind, scopes)})
    if owner is not None:
        rows = rows.filter(**{f"{owner_field}__in": _valid(owner_field, kind, (owner,))})
    return rows


_MODELS: dict[str, Any] = {"message": MessageVector, "chunk": Chunk, "memory": ArchivalMemory}
_TENANT = {"message": "conversation__tenant_id", "chunk": "tenant_id", "memory": "tenant_id"}
_NARROWING = {
    "message": ("conversation_id", "conversation__end_user_id"),
    "chunk": ("scope_key", "document__end_user_id"),
    "memory": ("end_user_id", "end_user_id"),
}


def _valid(path: str, kind: Kind, values: Iterable[str]) -> list[Any]:
    """The values that are keys of the column at `path` (a lookup like conversation__end_user_id)."""
    model = _MODELS[kind]
    *relations, name = path.split("__")
    for relation in relations:
        model = model._meta.get_field(relation).related_model
    field = model._meta.get_field(name.removesuffix("_id") if name.endswith("_id") else name)
    target = field.target_field if field.is_relation else field
    out = []
    for value in values:
        try:
            out.append(target.to_python(value))
        except (ValidationError, ValueError, TypeError):
            continue
    return out


def _records(kind: Kind, row: tuple[Any, ...], dimension: int) -> Iterator[VectorRecord]:
    pk, tenant_id, scope, owner, blob = row[:5]
    vectors = from_bytes(blob)
    # Another model's vectors (another length) are not comparable with this store's: left out.
    if kind == "message":
        if row[5] != dimension:
            return
        matrix = vectors.reshape(-1, dimension)
    else:
        if vectors.size != dimension:
            return
        matrix = vectors[None, :]
    for part, vector in enumerate(matrix):
        yield VectorRecord(
            kind, str(tenant_id), str(scope), str(pk), vector, part=part, owner=str(owner or "")
        )


class DatabaseRows:
    """The numpy store's loader: the vectors of one tenant and kind, straight from their tables."""

    def __init__(self, dimension: int = DIMENSION) -> None:
        self.dimension = dimension

    def load(
        self, kind: Kind, tenant_id: str, *, scopes: tuple[str, ...] | None = None, owner: str | None = None
    ) -> Iterable[VectorRecord]:
        for row in _narrowed(kind, tenant_id, scopes, owner).iterator(chunk_size=READ_CHUNK):
            yield from _records(kind, row, self.dimension)

    def count(self, kind: Kind) -> int:
        return sum(len(batch) for batch in record_batches(kind, dimension=self.dimension))


def record_batches(
    kind: Kind, *, batch_size: int = 1000, dimension: int = DIMENSION
) -> Iterator[list[VectorRecord]]:
    """Every vector of the kind over every tenant, in batches of rows in primary-key order."""
    rows = _rows(kind).order_by("pk")
    batch: list[VectorRecord] = []
    count = 0
    for row in rows.iterator(chunk_size=READ_CHUNK):
        batch.extend(_records(kind, row, dimension))
        count += 1
        if count == batch_size:
            yield batch
            batch, count = [], 0
    if batch:
        yield batch


def row_count(kind: Kind) -> int:
    """Rows of the kind with a vector (a message row holds one vector per passage)."""
    return _rows(kind).count()


def records_of(kind: Kind, ids: Iterable[Any], *, dimension: int = DIMENSION) -> list[VectorRecord]:
    """The vectors of these rows of the kind (a message's by its message id) that a search may return: an
    invalidated memory, a chunk or memory without a vector, a row gone, has none."""
    rows = _rows(kind).filter(pk__in=list(ids))
    return [
        record for row in rows.iterator(chunk_size=READ_CHUNK) for record in _records(kind, row, dimension)
    ]
