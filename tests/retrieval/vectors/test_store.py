"""The vector-store interface on both backends: add and search, tenant isolation whatever the filters, scope
filters, deletes that follow message, document and end-user deletes."""

import numpy as np
import pytest

from conversations.models import Message
from knowledge.models import Document
from memory.enduser import end_user_delete
from retrieval.vectors.store import (
    KINDS,
    VectorFilters,
    VectorScope,
    forget_end_user,
)
from tenants.models import EndUser
from tests.retrieval.vectors.conftest import all_records

pytestmark = pytest.mark.django_db


def _ids(hits) -> set[str]:
    return {hit.id for hit in hits}


def test_a_vector_finds_itself_first_in_every_kind(store, corpora):
    mine, _ = corpora
    for kind, item in (
        ("message", mine.messages["a1"][1]),
        ("chunk", mine.chunks["handbook"][2]),
        ("memory", mine.memories["alice"][0]),
    ):
        hits = store.search(VectorScope(kind, mine.tenant_id), mine.vectors[item], k=3)
        assert len(hits) == 3
        assert (hits[0].id, hits[0].part) == (item, 0)
        assert hits[0].score == pytest.approx(1.0, abs=1e-3)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_a_message_has_a_vector_per_passage(store, corpora):
    mine, _ = corpora
    item = mine.messages["a2"][0]
    hits = store.search(
        VectorScope("message", mine.tenant_id), mine.vectors[item], k=20, filters=VectorFilters(ids=(item,))
    )
    assert sorted((h.id, h.part) for h in hits) == [(item, 0), (item, 1)]
    assert {h.scope for h in hits} == {mine.conversations["a2"]}


_OUTSIDER_FILTERS = [
    None,
    "their conversation",
    "their end user",
    "their ids",
    '" or tenant_id != "',
    "\\",
]


@pytest.mark.parametrize("attempt", _OUTSIDER_FILTERS)
def test_an_outsider_never_gets_another_tenants_vectors(store, corpora, attempt):
    mine, theirs = corpora
    everything_of_mine = {
        i for ids in (*mine.messages.values(), *mine.chunks.values(), *mine.memories.values()) for i in ids
    }
    filters = {
        None: VectorFilters(),
        "their conversation": VectorFilters(
            scopes=(mine.conversations["a1"], "tenant", mine.end_users["alice"])
        ),
        "their end user": VectorFilters(owner=mine.end_users["alice"]),
        "their ids": VectorFilters(ids=tuple(everything_of_mine)),
    }.get(attempt) or VectorFilters(scopes=(attempt,), exclude_scopes=(attempt,), ids=(attempt,))
    for kind in KINDS:
        for item in list(everything_of_mine)[:4]:
            hits = store.search(
                VectorScope(kind, theirs.tenant_id), mine.vectors[item], k=50, filters=filters
            )
            assert not _ids(hits) & everything_of_mine


def test_scope_filters_narrow_to_a_conversation_or_the_end_users_other_conversations(store, corpora):
    mine, _ = corpora
    scope = VectorScope("message", mine.tenant_id)
    query = mine.vectors[mine.messages["b1"][0]]
    in_a1 = store.search(scope, query, k=50, filters=VectorFilters(scopes=(mine.conversations["a1"],)))
    assert _ids(in_a1) == set(mine.messages["a1"])
    others = store.search(
        scope, query, k=50,
        filters=VectorFilters(owner=mine.end_users["alice"], exclude_scopes=(mine.conversations["a1"],)),
    )  # fmt: skip
    assert _ids(others) == set(mine.messages["a2"])
    tenant_wide = store.search(scope, query, k=50)
    assert _ids(tenant_wide) == {i for ids in mine.messages.values() for i in ids}
    assert tenant_wide[0].id == mine.messages["b1"][0]


def test_knowledge_and_memory_scopes(store, corpora):
    mine, _ = corpora
    query = np.ones(384, dtype=np.float32) / np.sqrt(384)
    handbook = store.search(
        VectorScope("chunk", mine.tenant_id), query, k=50, filters=VectorFilters(scopes=("tenant",))
    )
    assert _ids(handbook) == set(mine.chunks["handbook"])
    bobs = store.search(
        VectorScope("memory", mine.tenant_id),
        query,
        k=50,
        filters=VectorFilters(scopes=(mine.end_users["bob"],)),
    )
    assert _ids(bobs) == set(mine.memories["bob"])
    assert store.search(VectorScope("memory", mine.tenant_id), query, k=0) == []
    assert (
        store.search(VectorScope("chunk", mine.tenant_id), query, k=5, filters=VectorFilters(scopes=())) == []
    )


def test_adding_again_stores_each_vector_once(store, corpora):
    counts = {kind: store.count(kind) for kind in KINDS}
    assert counts == {"message": 2 * 2 * 3 * 3, "chunk": 2 * 2 * 3, "memory": 2 * 3}
    store.add(all_records())
    assert {kind: store.count(kind) for kind in KINDS} == counts
    keys = [record.key for record in all_records()]
    assert store.present("message", keys) >= {r.key for r in all_records() if r.kind == "message"}


def test_a_deleted_message_leaves_no_vector(store, corpora):
    mine, _ = corpora
    item = mine.messages["a1"][0]
    Message.objects.filter(pk=item).delete()
    store.delete(VectorScope("message", mine.tenant_id), VectorFilters(ids=(item,)))
    hits = store.search(VectorScope("message", mine.tenant_id), mine.vectors[item], k=50)
    assert item not in _ids(hits)
    assert len(hits) == 2 * (3 * 3 - 1)


def test_a_deleted_document_leaves_no_chunk(store, corpora):
    mine, theirs = corpora
    Document.objects.filter(pk=mine.documents["handbook"]).delete()
    store.delete(VectorScope("chunk", mine.tenant_id), VectorFilters(ids=tuple(mine.chunks["handbook"])))
    hits = store.search(VectorScope("chunk", mine.tenant_id), mine.vectors[mine.chunks["handbook"][0]], k=50)
    assert _ids(hits) == set(mine.chunks["alice-notes"])
    # The same document of another tenant is untouched.
    theirs_hits = store.search(
        VectorScope("chunk", theirs.tenant_id), theirs.vectors[theirs.chunks["handbook"][0]], k=1
    )
    assert theirs_hits[0].id == theirs.chunks["handbook"][0]


def test_an_end_users_data_delete_removes_every_vector_of_theirs(store, corpora):
    mine, theirs = corpora
    alice = EndUser.objects.get(pk=mine.end_users["alice"])
    end_user_delete(end_user=alice)
    Document.objects.filter(pk=mine.documents["alice-notes"]).delete()  # cascades with the end user too
    forget_end_user(store, tenant_id=mine.tenant_id, end_user_id=mine.end_users["alice"])
    alices = {
        *mine.messages["a1"], *mine.messages["a2"], *mine.chunks["alice-notes"], *mine.memories["alice"],
    }  # fmt: skip
    for kind in KINDS:
        for item in alices:
            hits = store.search(VectorScope(kind, mine.tenant_id), mine.vectors[item], k=50)
            assert not _ids(hits) & alices
    remaining = store.search(
        VectorScope("message", mine.tenant_id), mine.vectors[mine.messages["b1"][0]], k=50
    )
    assert _ids(remaining) == set(mine.messages["b1"])
    # The outsider's Alice (same external id, another tenant) keeps everything.
    theirs_hits = store.search(
        VectorScope("memory", theirs.tenant_id), theirs.vectors[theirs.memories["alice"][0]], k=50
    )
    assert _ids(theirs_hits) == {*theirs.memories["alice"], *theirs.memories["bob"]}
