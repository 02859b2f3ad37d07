"""The tenant-wide searches on each vector store (numpy, Milvus Lite): archival memories hybrid and scoped, an
outsider never reached; the engine follows writes and deletes (an end user's data delete leaves none of
their vectors); an engine that cannot be reached leaves retrieval lexical, reported, never an error."""

import pytest

from conversations.embedding import message_vectors_fill
from memory.archival import archival_insert, archival_search
from memory.models import ArchivalMemory
from retrieval.vectors import follow
from retrieval.vectors.config import parse_vector_store
from retrieval.vectors.current import vector_store_reset
from retrieval.vectors.degraded import VECTOR_STORE_UNAVAILABLE
from tenants.services import end_user_get_or_create
from tests.context.helpers import append, context_call
from tests.knowledge.conftest import upload
from tests.retrieval.backends import vectors_of_end_user
from tests.retrieval.vectors.test_engine import _closed_port

pytestmark = pytest.mark.django_db


def test_archival_search_is_hybrid_scoped_and_leaves_invalidated_memories_out(
    vector_backend, owner, outsider, local_embeddings
):
    alice = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    bob = end_user_get_or_create(tenant=owner.tenant, external_id="bob")
    mallory = end_user_get_or_create(tenant=outsider.tenant, external_id="alice")
    for end_user in (bob, mallory):
        archival_insert(end_user=end_user, content="The vault entry for rollbacks is zebra-quartz-42.")
    outcome = archival_search(end_user=alice, query="zebra-quartz-42 vault")
    assert outcome.mode == "hybrid" and outcome.hits == []
    old = archival_insert(end_user=alice, content="My favourite editor is vim-9.1.").memory
    new = archival_insert(end_user=alice, content="My favourite editor is helix-24.07.").memory
    assert ArchivalMemory.objects.get(pk=old.pk).invalidated_at is not None
    outcome = archival_search(end_user=alice, query="which text editor do I like best")
    assert [h.memory.pk for h in outcome.hits] == [new.pk]
    assert outcome.hits[0].vector_rank == 1 and outcome.hits[0].similarity > 0.3
    # The outsider's memory, worded the same, is found by the outsider alone.
    [hit] = archival_search(end_user=mallory, query="rollback vault entry").hits
    assert hit.memory.end_user_id == mallory.pk


def test_deleting_an_end_user_leaves_none_of_their_vectors(
    vector_backend, owner, conversation, local_embeddings
):
    alice = conversation.end_user
    append(conversation, {"role": "user", "content": "The staging database uses port 6543."})
    message_vectors_fill(conversation_id=conversation.id)
    upload(owner, ("alice.md", b"Alice keeps her notes on the release train."), end_user="alice")
    archival_insert(end_user=alice, content="Alice prefers short answers.")
    bob = end_user_get_or_create(tenant=owner.tenant, external_id="bob")
    archival_insert(end_user=bob, content="Bob prefers long answers.")
    assert vectors_of_end_user(owner.tenant.pk, alice.pk) == {"message": 1, "chunk": 1, "memory": 1}

    assert owner.client.delete("/api/v1/users/alice").status_code == 200

    assert vectors_of_end_user(owner.tenant.pk, alice.pk) == {"message": 0, "chunk": 0, "memory": 0}
    assert vectors_of_end_user(owner.tenant.pk, bob.pk)["memory"] == 1


def test_a_document_deleted_and_a_memory_deleted_leave_the_engine(vector_backend, owner, local_embeddings):
    document = upload(owner, ("a.md", b"Zeppelin maintenance schedule.")).json()["documents"][0]
    alice = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    memory = archival_insert(end_user=alice, content="Alice flies zeppelins on weekends.").memory
    response = owner.client.post("/api/v1/knowledge/search", {"query": "airship upkeep"}, format="json")
    assert [r["document_name"] for r in response.json()["results"]] == ["a.md"]
    assert response.json()["results"][0]["similarity"] > 0

    assert owner.client.delete(f"/api/v1/documents/{document['id']}").status_code == 204
    assert owner.client.delete(f"/api/v1/users/alice/memories/{memory.pk}").status_code == 204

    assert vectors_of_end_user(owner.tenant.pk, alice.pk)["memory"] == 0
    assert (
        owner.client.post("/api/v1/knowledge/search", {"query": "airship"}, format="json").json()["results"]
        == []
    )


@pytest.fixture
def engine_down(settings, monkeypatch):
    settings.MNEMO_VECTOR_STORE = parse_vector_store(f"milvus://127.0.0.1:{_closed_port()}")
    # Writes are sent at once, as on a commit: each fails, logged and counted, and the request goes on.
    monkeypatch.setattr(follow, "on_commit", lambda send, robust=False: send())
    vector_store_reset()
    yield
    vector_store_reset()


def test_an_unreachable_engine_leaves_retrieval_lexical_and_says_so(
    engine_down, owner, conversation, local_embeddings
):
    upload(owner, ("ports.md", b"The staging database listens on port 6543."))
    archival_insert(end_user=conversation.end_user, content="The staging database uses port 6543.")
    append(conversation, {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"})

    response = context_call(owner, conversation, user_message="Which port does the staging database use?")
    assert response.status_code == 200, response.content
    body = response.json()
    assert {"stage": "retrieve", "code": VECTOR_STORE_UNAVAILABLE} in [
        {"stage": d["stage"], "code": d["code"]} for d in body["degradations"]
    ]
    assert "6543" in body["messages"][-1]["content"]

    found = owner.client.post("/api/v1/knowledge/search", {"query": "staging port"}, format="json").json()
    assert found["results"] and found["degradations"][0]["code"] == VECTOR_STORE_UNAVAILABLE
    memories = owner.client.get("/api/v1/users/alice/memories/search", {"q": "staging port"}).json()
    assert memories["mode"] == "lexical" and memories["results"]
    assert memories["degradations"][0]["code"] == VECTOR_STORE_UNAVAILABLE
    assert owner.client.get("/readyz").json()["checks"]["vector_store"] == "degraded (milvus unavailable)"
