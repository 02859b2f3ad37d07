"""Archival memory: insert, near-duplicate merge, contradiction invalidation, hybrid search (RRF k = 60) with
the local MiniLM when installed and lexical only (reported) otherwise, delete, recall of old messages, B5."""

import pytest

from memory.archival import archival_insert, archival_revert, archival_search, subject_key
from memory.facts import fact_signature, supersedes
from memory.models import Actor, ArchivalMemory, MemoryOperation
from providers import embeddings
from providers.text import search_words
from retrieval.lexical import bm25_rank
from retrieval.ranking import RRF_K, rrf
from tenants.services import end_user_get_or_create
from tests.summaries.helpers import context, history

pytestmark = pytest.mark.django_db

URL = "/api/v1/users/alice/memories"


def insert(actor, content, **body):
    return actor.client.post(URL, {"content": content, **body}, format="json")


def test_insert_list_get_and_delete(owner, conversation, lexical_only):
    created = insert(owner, "Alice deploys on Tuesdays.", kind="preference", importance=0.8)
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["action"] == "inserted"
    assert body["memory"]["kind"] == "preference"
    assert [d["code"] for d in body["degradations"]] == ["embeddings_unavailable"]
    memory_id = body["memory"]["id"]
    assert [m["id"] for m in owner.client.get(URL).json()["memories"]] == [memory_id]
    assert owner.client.get(f"{URL}/{memory_id}").json()["content"] == "Alice deploys on Tuesdays."
    assert owner.client.delete(f"{URL}/{memory_id}").status_code == 204
    assert not ArchivalMemory.objects.exists()
    ops = [o.op for o in MemoryOperation.objects.order_by("created_at", "id")]
    assert ops == ["archival_memory_insert", "archival_memory_delete"]


def test_near_duplicates_merge(owner, conversation, lexical_only):
    insert(owner, "Alice prefers dark mode in every editor.")
    again = insert(owner, "alice prefers  dark mode in every editor", importance=0.9)
    assert again.status_code == 200
    assert again.json()["action"] == "merged"
    memory = ArchivalMemory.objects.get()
    assert (memory.mentions, memory.importance) == (2, 0.9)


def test_a_contradicting_fact_invalidates_the_older_one(owner, conversation, lexical_only):
    old = insert(owner, "My favourite colour is green.").json()["memory"]
    assert old["subject"] == "favourite_colour"
    new = insert(owner, "My favourite colour is blue.").json()
    assert new["invalidated"] == [old["id"]]
    stored = ArchivalMemory.objects.get(pk=old["id"])
    assert stored.invalidated_at is not None and str(stored.invalidated_by_id) == new["memory"]["id"]
    hits = owner.client.get(f"{URL}/search", {"q": "favourite colour"}).json()["results"]
    assert [h["memory"]["content"] for h in hits] == ["My favourite colour is blue."]
    listed = owner.client.get(URL, {"include_invalidated": "true"}).json()["memories"]
    assert len(listed) == 2
    explicit = insert(owner, "Deploys go through Jenkins.", subject="ci").json()
    replaced = insert(owner, "Deploys go through GitHub Actions now.", subject="ci").json()
    assert replaced["invalidated"] == [explicit["memory"]["id"]]


def test_lexical_search_reports_the_degradation(owner, conversation, lexical_only):
    insert(owner, "The staging database is on port 5433.")
    insert(owner, "Alice's manager is Bob.")
    response = owner.client.get(f"{URL}/search", {"q": "which port does staging use"})
    body = response.json()
    assert body["mode"] == "lexical"
    assert [d["code"] for d in body["degradations"]] == ["embeddings_unavailable"]
    top = body["results"][0]
    assert top["memory"]["content"] == "The staging database is on port 5433."
    assert (top["lexical_rank"], top["vector_rank"], top["score"]) == (1, None, round(1 / (RRF_K + 1), 6))


def test_hybrid_search_with_local_minilm_finds_paraphrases(owner, conversation, local_embeddings):
    for text in (
        "Alice is allergic to peanuts.",
        "The release train leaves every second Thursday.",
        "Alice's laptop runs Fedora Linux.",
    ):
        body = insert(owner, text).json()
        assert body["degradations"] == []
        assert body["memory"]["embedding_model"] == embeddings.INT8_NAME
    body = owner.client.get(f"{URL}/search", {"q": "food intolerance nuts"}).json()
    assert body["mode"] == "hybrid" and body["degradations"] == []
    assert body["results"][0]["memory"]["content"] == "Alice is allergic to peanuts."
    assert body["results"][0]["vector_rank"] == 1
    # A paraphrase is merged by vector similarity.
    merged = insert(owner, "Alice has an allergy to peanuts.").json()
    assert merged["action"] == "merged"
    # Alike sentences with different particulars are two facts, not a duplicate.
    assert insert(owner, "The deploy key for billing staging is KX-4821.").json()["action"] == "inserted"
    assert insert(owner, "The deploy key for search staging is JP-1937.").json()["action"] == "inserted"


def test_rrf_and_tokens():
    assert rrf(["a", "b"], ["b", "c"]) == {"a": 1 / 61, "b": 1 / 62 + 1 / 61, "c": 1 / 62}
    assert "那个" in search_words("刚才说的那个文件")
    assert bm25_rank("那个文件", ["这是那个文件", "something else"])[0][0] == 0
    assert subject_key("The user's timezone is CET") == "timezone"
    assert subject_key("Deploys are manual") == ""


def test_b5_carries_memories_and_recalled_messages_with_their_seq(owner, conversation, lexical_only):
    end_user = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    archival_insert(end_user=end_user, content="Alice's staging cluster is called kestrel.")
    archival_insert(end_user=end_user, content="Alice likes short answers.")
    messages = history(conversation, 30)
    marker = messages[2]
    marker.content = "The rollback password vault entry is zebra-quartz-42."
    marker.save(update_fields=["content"])
    response = owner.client.post(f"/api/v1/conversations/{conversation.id}/compact", {}, format="json")
    assert response.status_code == 200
    body = context(
        owner, conversation, user_message="Which vault entry holds the rollback password for kestrel?"
    )
    items = body["blocks"]["B5"]["items"]
    kinds = [(i["kind"], seq) for i in items for seq in i.get("seqs", [i.get("seq")])]
    assert ("message", marker.seq) in kinds
    assert items[0]["kind"] == "archival"
    assert "kestrel" in body["messages"][-1]["content"]
    assert "embeddings_unavailable" in [d["code"] for d in body["degradations"]]
    disabled = context(
        owner,
        conversation,
        user_message="Which vault entry holds the rollback password?",
        retrieval={"enabled": False},
    )
    assert "B5" not in disabled["blocks"]


def test_search_service_ignores_other_users(owner, lexical_only):
    alice = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    bob = end_user_get_or_create(tenant=owner.tenant, external_id="bob")
    archival_insert(end_user=bob, content="Bob's secret is swordfish.")
    assert archival_search(end_user=alice, query="swordfish").hits == []


@pytest.mark.parametrize(
    "body, error",
    [
        ({}, "required"),
        ({"content": "x", "kind": "rumour"}, "invalid_choice"),
        ({"content": "x", "importance": 2}, "max_value"),
        ({"content": "x", "colour": 1}, "unknown_field"),
        ({"content": "x", "conversation_id": "not-a-uuid"}, "invalid"),
    ],
)
def test_bad_input(owner, conversation, lexical_only, body, error):
    response = owner.client.post(URL, body, format="json")
    assert response.status_code == 400
    assert error in response.content.decode()


def test_outsider_and_anonymous(
    owner, outsider, anonymous, conversation, outsider_conversation, lexical_only
):
    memory_id = insert(owner, "Alice's secret is swordfish.").json()["memory"]["id"]
    assert outsider.client.get(URL).status_code == 404
    assert outsider.client.get(f"{URL}/search", {"q": "swordfish"}).status_code == 404
    assert outsider.client.get(f"{URL}/{memory_id}").status_code == 404
    assert outsider.client.delete(f"{URL}/{memory_id}").status_code == 404
    # The outsider cannot attach a memory to the owner's conversation.
    assert insert(outsider, "x", conversation_id=str(conversation.id)).status_code == 404
    assert owner.client.get(f"{URL}/not-a-uuid").status_code == 404
    for response in (
        anonymous.get(URL),
        anonymous.post(URL, {"content": "x"}, format="json"),
        anonymous.get(f"{URL}/search", {"q": "x"}),
        anonymous.delete(f"{URL}/{memory_id}"),
    ):
        assert response.status_code == 401
    assert ArchivalMemory.objects.filter(tenant=owner.tenant).count() == 1
    assert owner.client.get(f"{URL}/search").status_code == 400  # q is required


def test_a_newer_value_for_the_same_thing_invalidates_the_older_fact(owner, conversation, lexical_only):
    old = insert(owner, "The ledger staging Postgres does not listen on 5432, it's on port 23456.").json()
    assert old["memory"]["subject"] == ""
    other_service = insert(owner, "The checkout staging database answers on port 41000.").json()
    production = insert(owner, "The ledger production database is on port 5999.").json()
    other_thing = insert(owner, "The ledger staging deploy key is QW-4821.").json()
    assert other_service["invalidated"] == production["invalidated"] == other_thing["invalidated"] == []

    new = insert(owner, "They moved the ledger staging database; it answers on port 34567 now.").json()
    assert new["action"] == "inserted"
    assert new["invalidated"] == [old["memory"]["id"]]
    stored = ArchivalMemory.objects.get(pk=old["memory"]["id"])
    assert str(stored.invalidated_by_id) == new["memory"]["id"]
    operation = MemoryOperation.objects.get(op="archival_memory_invalidate")
    assert operation.target == f"archival:{old['memory']['id']}"
    assert operation.trigger == "a newer fact gives another value for 'ledger staging database port'"
    live = {m["content"] for m in owner.client.get(URL).json()["memories"]}
    assert live == {
        "They moved the ledger staging database; it answers on port 34567 now.",
        "The checkout staging database answers on port 41000.",
        "The ledger production database is on port 5999.",
        "The ledger staging deploy key is QW-4821.",
    }
    # Reverting the invalidation (support staff) brings the old fact back.
    archival_revert(operation=operation, actor=Actor.ADMIN)
    assert ArchivalMemory.objects.get(pk=old["memory"]["id"]).invalidated_at is None


def test_reverting_a_delete_restores_the_memory_without_invalidating_newer_ones(
    owner, conversation, lexical_only
):
    """Undoing a delete brings the old statement back as it was: it must not act as a newer fact and replace
    what was learnt after it (by value or by subject)."""
    old = insert(owner, "The ledger staging database answers on port 23456.").json()["memory"]
    owner.client.delete(f"{URL}/{old['id']}")
    delete = MemoryOperation.objects.get(op="archival_memory_delete")
    newer = insert(owner, "The ledger staging database answers on port 34567 now.").json()
    assert newer["invalidated"] == []  # the old one was gone already
    by_subject_old = insert(owner, "Alice's editor is vim.", subject="editor").json()["memory"]
    owner.client.delete(f"{URL}/{by_subject_old['id']}")
    delete_by_subject = MemoryOperation.objects.filter(op="archival_memory_delete").latest("created_at")
    by_subject_new = insert(owner, "Alice's editor is helix.", subject="editor").json()["memory"]

    archival_revert(operation=delete, actor=Actor.ADMIN)
    archival_revert(operation=delete_by_subject, actor=Actor.ADMIN)

    live = set(ArchivalMemory.objects.filter(invalidated_at__isnull=True).values_list("content", flat=True))
    assert live == {
        "The ledger staging database answers on port 23456.",
        "The ledger staging database answers on port 34567 now.",
        "Alice's editor is vim.",
        "Alice's editor is helix.",
    }
    assert ArchivalMemory.objects.get(pk=newer["memory"]["id"]).invalidated_by is None
    assert ArchivalMemory.objects.get(pk=by_subject_new["id"]).invalidated_at is None
    assert not MemoryOperation.objects.filter(op="archival_memory_invalidate").exists()


def test_reverting_a_delete_restores_kind_subject_importance_and_sources(owner, conversation, lexical_only):
    end_user = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    stored = archival_insert(
        end_user=end_user,
        content="Alice prefers answers in French.",
        kind=ArchivalMemory.Kind.PREFERENCE,
        importance=0.9,
        subject="answer language",
        conversation=conversation,
        source_message_ids=["m-1", "m-2"],
    ).memory
    assert owner.client.delete(f"{URL}/{stored.id}").status_code == 204
    delete = MemoryOperation.objects.get(op="archival_memory_delete")
    listed = owner.client.get("/api/v1/users/alice/memory/operations").json()["operations"][0]
    assert listed["details"]["kind"] == "preference" and listed["details"]["importance"] == 0.9

    archival_revert(operation=delete, actor=Actor.ADMIN)

    restored = ArchivalMemory.objects.get(end_user=end_user)
    assert restored.content == "Alice prefers answers in French."
    assert (restored.kind, restored.importance, restored.subject) == ("preference", 0.9, stored.subject)
    assert restored.conversation_id == conversation.id
    assert restored.source_message_ids == ["m-1", "m-2"]


def test_the_same_value_restated_or_an_explicit_subject_does_not_invalidate_by_signature(
    owner, conversation, lexical_only
):
    first = insert(owner, "Alerts for ledger go to the Slack channel #ops-falcon-quartz.").json()
    again = insert(owner, "btw the ledger alert channel is #ops-falcon-quartz.").json()
    assert again["invalidated"] == []
    # An explicit subject keeps its own rule: only memories with that subject are replaced.
    explicit = insert(
        owner, "We renamed the ledger alert channel, it's #ops-tundra-harbor now.", subject="x"
    ).json()
    assert explicit["invalidated"] == []
    # Without one, the newer channel replaces both statements of the old one.
    newer = insert(owner, "We renamed the ledger alert channel again, it's #ops-cobalt-lantern now.").json()
    assert set(newer["invalidated"]) == {
        first["memory"]["id"],
        again["memory"]["id"],
        explicit["memory"]["id"],
    }
    # Preferences and episodes are not facts with values: nothing replaces them by signature.
    kept = insert(owner, "The ledger alert channel was #ops-x1-old during the outage.", kind="context").json()
    assert kept["invalidated"] == []


def test_alike_sentences_with_other_values_do_not_merge(owner, conversation, lexical_only):
    old = insert(
        owner, "The nightly export for the finance team writes to bucket acme-finance-export-eu2."
    ).json()
    new = insert(
        owner, "The nightly export for the finance team writes to bucket acme-finance-export-us1."
    ).json()
    assert new["action"] == "inserted"  # not merged into the old wording
    assert new["invalidated"] == [old["memory"]["id"]]


@pytest.mark.parametrize(
    "old, new, replaces",
    [
        (
            "My on-call pager number is +44 20 7946 1234, in case.",
            "My pager number changed, it's +44 20 7946 5678 now.",
            True,
        ),
        (
            "Ingrid Solberg took over ownership of ledger last sprint.",
            "Org change: ledger is owned by Tariq Haddad.",
            True,
        ),
        (
            "Finance approved a monthly cloud budget of $45,300 for ledger.",
            "The ledger cloud budget was cut to $32,100 a month.",
            True,
        ),
        (
            "The partner API that ledger calls throttles us at 4550 requests per minute.",
            "The partner raised the ledger limit: 6750 requests per minute.",
            True,
        ),
        (
            "We decided to freeze ledger deploys starting 2025-11-15.",
            "The ledger deploy freeze got pushed, it now starts 2025-12-20.",
            True,
        ),
        # Another service, another environment, another kind of value, another thing of the same service.
        (
            "Finance approved a monthly cloud budget of $45,300 for ledger.",
            "The checkout cloud budget was cut to $32,100 a month.",
            False,
        ),
        ("The ledger staging DB is on port 23456.", "The ledger replica DB is on port 23457.", False),
        (
            "The ledger staging DB is on port 23456.",
            "The ledger staging DB is on bastion-12.eu2.acme.internal.",
            False,
        ),
        (
            "The ledger staging deploy key is QW-4821.",
            "The ledger break-glass vault entry is FalconQuartz42.",
            False,
        ),
        (
            "Ingrid Solberg took over ownership of ledger.",
            "Ingrid Solberg took over ownership of checkout.",
            False,
        ),
        (
            "Deploys of ledger are manual.",
            "Deploys of ledger go through pipeline P-1234.",
            False,
        ),  # no old value
    ],
)
def test_supersedes_is_conservative(old, new, replaces):
    assert bool(supersedes(fact_signature(new), fact_signature(old))) is replaces


def test_the_embedding_is_computed_before_the_row_lock_and_its_transaction(owner, monkeypatch):
    """A slow embedder (a model loading, a remote call) must not hold the end user's row lock: the vector
    is computed before archival_insert opens its transaction, and the rows are written inside one."""
    from django.db import connection

    import memory.archival

    end_user = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    depth_outside = len(connection.atomic_blocks)
    seen = {}

    def embed(texts):
        seen["embed"] = len(connection.atomic_blocks)
        return None, "no embedder in this test"

    real_create = ArchivalMemory.objects.create

    def create(**fields):
        seen["create"] = len(connection.atomic_blocks)
        return real_create(**fields)

    monkeypatch.setattr(memory.archival, "embed", embed)
    monkeypatch.setattr(ArchivalMemory.objects, "create", create)
    outcome = archival_insert(end_user=end_user, content="The ledger DB listens on port 5433.")
    assert outcome.action == "inserted"
    assert seen == {"embed": depth_outside, "create": depth_outside + 1}


def test_a_search_hit_carries_the_cosine_of_the_memory_with_the_query(owner, local_embeddings):
    import numpy as np

    from memory.archival import archival_search
    from providers.embeddings import embed_query, from_bytes

    end_user = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    archival_insert(end_user=end_user, content="Alice's staging cluster is called kestrel.")
    archival_insert(end_user=end_user, content="Alice likes short answers.")

    outcome = archival_search(end_user=end_user, query="What is the staging cluster called?")

    query_vector, _ = embed_query("What is the staging cluster called?")
    for hit in outcome.hits:
        expected = float(np.dot(from_bytes(hit.memory.embedding), query_vector))
        assert hit.similarity == pytest.approx(expected, abs=1e-4)
    assert outcome.hits[0].memory.content.endswith("kestrel.")
    assert outcome.hits[0].similarity > outcome.hits[1].similarity
