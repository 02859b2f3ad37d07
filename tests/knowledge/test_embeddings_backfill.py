"""After a change of embedding model, `manage.py embeddings_backfill` embeds again what search would compare
only by its words: messages, archival memories and knowledge chunks with vectors of another model, of one
tenant when asked, and the documents' indexes reload."""

import numpy as np
from django.core.management import call_command

from knowledge.models import Chunk, Document
from memory.archival import archival_insert
from memory.models import ArchivalMemory
from providers import embeddings
from tenants.services import end_user_get_or_create
from tests.knowledge.conftest import upload

SOURCE = b'def refund(invoice):\n    """Give the customer their money back."""\n    return invoice.total\n'


def _as_old_model(model):
    model.objects.update(embedding_model="old-model", embedding=np.ones(384, dtype=np.float32).tobytes())


def test_memories_and_chunks_of_another_model_are_embedded_again(owner, outsider, local_embeddings):
    upload(owner, ("billing.py", SOURCE))
    upload(outsider, ("billing.py", SOURCE))
    for actor in (owner, outsider):
        user = end_user_get_or_create(tenant=actor.tenant, external_id="alice")
        archival_insert(end_user=user, content="Alice is allergic to peanuts.")
    name = embeddings.embedder_status().embedder.name
    assert set(Chunk.objects.values_list("embedding_model", flat=True)) == {name}
    _as_old_model(Chunk)
    _as_old_model(ArchivalMemory)
    processed = dict(Document.objects.values_list("pk", "processed_at"))

    call_command("embeddings_backfill", "--no-progress", "--tenant", owner.tenant.slug)

    for model, tenant_field in ((Chunk, "tenant"), (ArchivalMemory, "end_user__tenant")):
        mine = model.objects.filter(**{tenant_field: owner.tenant})
        theirs = model.objects.filter(**{tenant_field: outsider.tenant})
        assert mine.exists() and set(mine.values_list("embedding_model", flat=True)) == {name}
        assert set(theirs.values_list("embedding_model", flat=True)) == {"old-model"}
    memory = ArchivalMemory.objects.get(end_user__tenant=owner.tenant)
    vector = np.frombuffer(bytes(memory.embedding), dtype=np.float32)
    expected, _ = embeddings.embed([memory.content])
    assert np.allclose(vector, expected[0], atol=1e-6)
    for document in Document.objects.all():
        moved = document.processed_at != processed[document.pk]
        assert moved == (document.tenant_id == owner.tenant.id)  # its servers' indexes reload


def test_the_index_compares_the_chunks_by_meaning_again(owner, local_embeddings):
    upload(owner, ("billing.py", SOURCE))
    _as_old_model(Chunk)

    def similarity() -> float:
        response = owner.client.post("/api/v1/knowledge/search", {"query": "refund invoice"}, format="json")
        return response.json()["results"][0]["similarity"]

    assert similarity() == 0  # vectors of another model are not compared
    call_command("embeddings_backfill", "--no-progress")
    assert not Chunk.objects.filter(embedding_model="old-model").exists()
    assert similarity() > 0.5  # the index in this process reloaded


def test_one_conversation_leaves_memories_and_chunks_alone(owner, conversation, local_embeddings):
    upload(owner, ("billing.py", SOURCE))
    _as_old_model(Chunk)
    call_command("embeddings_backfill", "--no-progress", "--conversation", str(conversation.id))
    assert set(Chunk.objects.values_list("embedding_model", flat=True)) == {"old-model"}
