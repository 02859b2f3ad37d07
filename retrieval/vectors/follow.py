"""The vector engine follows the database rows: a write or delete of vectors (a message's, a chunk's, a
memory's) or of what owns them (a conversation, a document, an end user) is sent to the engine once the
transaction commits. Nothing is done with the numpy backend, which reads the rows themselves.

A write the engine refuses (it is down) is logged and counted, not retried here: `manage.py vectors_migrate`
copies every row the engine lacks (it is resumable), and is what an operator runs once the engine is back.
A delete it refuses is logged and counted as well; searches read their hits back from the database, so a
deleted row is never shown, but its vector stays in the engine until the next migrate of that kind."""

import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.db.transaction import on_commit

from providers.degradations import degradation_count
from retrieval.vectors.current import vector_engine
from retrieval.vectors.rows import records_of
from retrieval.vectors.store import (
    Kind,
    VectorFilters,
    VectorScope,
    VectorStore,
    VectorStoreUnavailable,
    forget_end_user,
)

logger = logging.getLogger(__name__)

WRITE_MISSED = "vector_store_write_missed"


def _on_commit(what: str, work: Callable[[VectorStore], None]) -> None:
    engine = vector_engine()
    if engine is None:
        return

    def send() -> None:
        try:
            work(engine)
        except VectorStoreUnavailable as exc:
            logger.warning("vector engine missed a %s (run vectors_migrate once it is back): %s", what, exc)
            degradation_count(WRITE_MISSED)

    on_commit(send, robust=True)


def follow_rows(kind: Kind, ids: Sequence[Any], *, tenant_id: Any) -> None:
    """These rows were written: their vectors go to the engine, and those that no longer have one a search
    may return (an invalidated memory, a vector removed) leave it."""
    if not ids:
        return

    def sync(engine: VectorStore) -> None:
        records = records_of(kind, ids)
        engine.add(records)
        gone = tuple(sorted({str(i) for i in ids} - {r.id for r in records}))
        if gone:
            engine.delete(VectorScope(kind, str(tenant_id)), VectorFilters(ids=gone))

    _on_commit(f"{kind} write", sync)


def follow_delete(kind: Kind, *, tenant_id: Any, filters: VectorFilters) -> None:
    """Rows of the tenant were deleted: the engine's vectors that match `filters` go too."""
    _on_commit(f"{kind} delete", lambda engine: engine.delete(VectorScope(kind, str(tenant_id)), filters))


def follow_end_user_delete(*, tenant_id: Any, end_user_id: Any) -> None:
    """An end user's data delete: every vector of theirs, of every kind, leaves the engine."""
    _on_commit(
        "end user delete",
        lambda engine: forget_end_user(engine, tenant_id=str(tenant_id), end_user_id=str(end_user_id)),
    )
