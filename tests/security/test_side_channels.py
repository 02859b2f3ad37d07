"""Side channels between tenants that answer no request with another tenant's data, but let one learn
something of another by timing: the query-embedding cache is kept per tenant."""

import numpy as np
import pytest

from providers import embeddings

pytestmark = pytest.mark.django_db

QUESTION = "Which database does the payroll service use?"


@pytest.fixture
def counted_embedder(monkeypatch):
    """An embedder that records every text it embeds: a cache hit embeds nothing."""
    embedded: list[str] = []

    class Counted(embeddings.Embedder):
        name, dimension = "counted", 2

        def embed(self, texts):
            embedded.extend(texts)
            return np.ones((len(texts), 2), dtype=np.float32)

    status = embeddings.EmbedderStatus(embedder=Counted(), reason="")
    monkeypatch.setattr(embeddings, "embedder_status", lambda: status)
    embeddings._query_cache.clear()
    yield embedded
    embeddings._query_cache.clear()


def search(actor):
    response = actor.client.get("/api/v1/users/alice/memories/search", {"q": QUESTION})
    assert response.status_code == 200, response.content
    return response


def test_one_tenants_search_never_warms_the_cache_for_another(owner, outsider, counted_embedder):
    for actor in (owner, outsider):
        created = actor.client.post(
            "/api/v1/users/alice/memories", {"content": "Payroll runs on Postgres."}, format="json"
        )
        assert created.status_code == 201, created.content
    counted_embedder.clear()

    search(owner)
    search(outsider)  # the same words, right after: embedded again, as costly as a question never asked
    assert counted_embedder == [QUESTION, QUESTION]
    search(owner)  # a tenant repeating its own question still finds it cached
    assert counted_embedder == [QUESTION, QUESTION]


def test_a_query_without_a_tenant_is_embedded_and_not_kept(counted_embedder):
    embeddings.query_cache_scope_set(None)
    vector, model = embeddings.embed_query(QUESTION)
    assert model == "counted" and vector.shape == (2,)
    assert not embeddings._query_cache


def test_a_request_without_a_key_does_not_inherit_the_previous_requests_tenant(owner, client):
    owner.client.get("/api/v1/conversations")  # this thread served the owner
    assert embeddings._query_scope.get() == str(owner.tenant.pk)
    client.get("/healthz")  # as the admin's pages: no API key
    assert embeddings._query_scope.get() is None
