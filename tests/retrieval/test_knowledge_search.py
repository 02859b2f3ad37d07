"""POST /api/v1/knowledge/search: identifier-aware lexical, symbol and vector hits fused with RRF, scopes,
kinds, deletion, outsiders."""

import pytest

from knowledge.identifiers import (
    looks_like_a_name,
    query_terms,
    split_identifier,
    terms,
    trigram_similarity,
    trigrams,
)
from retrieval.knowledge import knowledge_index
from tests.knowledge.conftest import code, upload
from tests.knowledge.files import PYTHON_SOURCE, TS_SOURCE, pdf_bytes

pytestmark = pytest.mark.django_db


def search(actor, query, **body):
    response = actor.client.post("/api/v1/knowledge/search", {"query": query, **body}, format="json")
    assert response.status_code == 200, response.json()
    return response.json()["results"]


def test_identifier_splitting():
    assert split_identifier("HTTPServerError") == ("http", "server", "error")
    assert split_identifier("get_user_name") == split_identifier("getUserName") == ("get", "user", "name")
    # "get user name" and getUsername share the joined word.
    assert set(query_terms("get user name")) & set(terms("def getUsername(user):")) >= {"get", "usernam"}
    assert trigram_similarity(trigrams("render invoice"), trigrams("render invoice")) == 1.0


def test_prose_queries_do_without_joins_and_fuzzy_symbols():
    assert looks_like_a_name("get user name") and looks_like_a_name("QuerySet.select_related")
    assert not looks_like_a_name("Return the user name of the account")
    assert "usernam" in query_terms("user name")
    assert "usernam" not in query_terms("Return the user name of the account")


def test_split_name_query_finds_the_function_with_its_lines(owner):
    upload(owner, ("billing.py", PYTHON_SOURCE))
    [first, *_] = search(owner, "get user name")
    assert first["symbol"] == "getUsername" and first["path"] == "billing.py"
    assert (first["start_line"], first["end_line"]) == (19, 20)
    assert first["citation"] == "billing.py:19-20 (getUsername)"
    assert set(first) >= {"document", "path", "start_line", "end_line", "symbol", "page", "content", "score"}
    upload(owner, ("api.ts", TS_SOURCE))
    [hit, *_] = search(owner, "HTTP server error", kinds=["code"])
    assert hit["symbol"] == "HTTPServerError" and hit["language"] == "typescript"


def test_fuzzy_symbol_match_survives_a_typo(owner):
    upload(owner, ("api.ts", TS_SOURCE))
    results = search(owner, "fetchCustomerAcount")
    assert results[0]["symbol"] == "fetchCustomerAccount"
    assert results[0]["symbol_similarity"] >= 0.3


def test_documents_are_cited_with_page(owner):
    upload(owner, ("requirements.pdf", pdf_bytes([["Intro."], ["Invoices are archived for ten years."]])))
    [hit, *_] = search(owner, "how long are invoices archived")
    assert hit["page"] == 2 and hit["citation"] == 'file "requirements.pdf", page 2'


def test_scope_and_kinds(vector_backend, owner, conversation):
    upload(owner, ("tenant.md", b"The retention policy keeps backups for 30 days."))
    upload(owner, ("bob.md", b"Bob's retention exception: backups kept 90 days."), end_user="bob")
    upload(
        owner, ("conv.md", b"This conversation's retention note: 7 days."), conversation=str(conversation.pk)
    )
    upload(owner, ("retention.py", b"def retention_days():\n    return 30\n"))

    def names(**body):
        return sorted({r["document_name"] for r in search(owner, "retention backups", **body)})

    assert names() == ["retention.py", "tenant.md"]
    assert names(end_user="bob") == ["bob.md", "retention.py", "tenant.md"]
    assert names(conversation=str(conversation.pk)) == ["conv.md", "retention.py", "tenant.md"]
    assert names(kinds=["document"]) == ["tenant.md"]
    assert names(kinds=["code"]) == ["retention.py"]


def test_deleted_documents_leave_the_results_and_new_ones_enter(vector_backend, owner):
    first = upload(owner, ("a.md", b"Zeppelin maintenance schedule.")).json()["documents"][0]
    assert search(owner, "zeppelin")
    owner.client.delete(f"/api/v1/documents/{first['id']}")
    assert search(owner, "zeppelin") == []
    upload(owner, ("b.md", b"Zeppelin hangar keys are with Ines."))
    assert [r["document_name"] for r in search(owner, "zeppelin")] == ["b.md"]


def test_lexical_only_without_embeddings_is_reported(owner, settings):
    from providers import embeddings

    upload(owner, ("a.md", b"Quarterly okr review notes."))
    settings.MNEMO_EMBEDDINGS = "none"
    embeddings._build.cache_clear()
    try:
        response = owner.client.post("/api/v1/knowledge/search", {"query": "okr review"}, format="json")
    finally:
        embeddings._build.cache_clear()
    body = response.json()
    assert body["results"] and body["degradations"][0]["code"] == "embeddings_unavailable"


def test_vectors_find_a_paraphrase(vector_backend, owner):
    from providers.embeddings import embedder_status

    if embedder_status().embedder is None:
        pytest.skip("no local embedding model installed")
    upload(owner, ("pets.md", b"Dogs need a walk twice a day.\n\nInvoices are due in 30 days."))
    upload(owner, ("other.md", b"The office closes at six."))
    [hit, *_] = search(owner, "how often should my puppy go outside")
    assert hit["document_name"] == "pets.md" and hit["similarity"] > 0.2


def test_index_follows_the_database(owner):
    upload(owner, ("a.md", b"alpha"))
    index = knowledge_index(owner.tenant.pk)
    assert len(index) == 1
    upload(owner, ("b.md", b"beta"))
    assert len(knowledge_index(owner.tenant.pk)) == 2


def test_bad_input(owner):
    response = owner.client.post("/api/v1/knowledge/search", {"query": "x", "kinds": ["pdf"]}, format="json")
    assert response.status_code == 400 and code(response) == "invalid_choice"
    response = owner.client.post("/api/v1/knowledge/search", {"query": "x", "limit": 0}, format="json")
    assert response.status_code == 400
    response = owner.client.post("/api/v1/knowledge/search", {"query": "x", "tops": 1}, format="json")
    assert code(response) == "unknown_field"
    response = owner.client.post(
        "/api/v1/knowledge/search", {"query": "x", "end_user": "nobody"}, format="json"
    )
    assert response.status_code == 404


def test_outsider_finds_nothing_of_the_owner(vector_backend, owner, outsider, conversation):
    upload(owner, ("secret.md", b"The vault combination is 4-8-15-16."))
    upload(owner, ("conv.md", b"vault notes of the conversation"), conversation=str(conversation.pk))
    assert search(outsider, "vault combination") == []
    response = outsider.client.post(
        "/api/v1/knowledge/search", {"query": "vault", "conversation": str(conversation.pk)}, format="json"
    )
    assert response.status_code == 404
    response = outsider.client.post(
        "/api/v1/knowledge/search", {"query": "vault", "end_user": "alice"}, format="json"
    )
    assert response.status_code == 404
    assert search(owner, "vault combination")


@pytest.mark.postgres
def test_pg_trgm_and_the_portable_similarity_agree(owner, settings):
    from django.db import connection

    from retrieval import knowledge as search_module

    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    upload(owner, ("api.ts", TS_SOURCE))
    index = knowledge_index(owner.tenant.pk)
    search_module._PG_TRGM = None
    if not search_module._pg_trgm_available():
        pytest.skip("pg_trgm is not installed")
    database = search_module._symbol_scores(index, "fetch customer acount")
    portable = index.symbol_similarity("fetch customer acount")
    assert database.max() > 0.3
    assert abs(database - portable).max() < 1e-4


def test_chunks_are_scored_under_the_index_lock(owner, monkeypatch):
    """As the history index: a sync() of another request may add chunks while this one scores."""
    upload(owner, ("billing.py", PYTHON_SOURCE))
    index = knowledge_index(owner.tenant.id)
    held = []
    bm25 = index.postings.bm25
    monkeypatch.setattr(index.postings, "bm25", lambda *a: held.append(index.lock.locked()) or bm25(*a))
    assert search(owner, "get user name")
    assert held == [True] and not index.lock.locked()


def test_the_question_is_embedded_after_the_bm25_pass(owner, monkeypatch):
    """A context call's question is still being embedded on another thread when knowledge is searched
    (providers.embeddings.embed_query_ahead): the BM25 pass runs first, instead of a wait for the vector."""
    import retrieval.knowledge

    upload(owner, ("billing.py", PYTHON_SOURCE))
    index = knowledge_index(owner.tenant.id)
    order = []
    bm25, embed_query = index.postings.bm25, retrieval.knowledge.embed_query
    monkeypatch.setattr(index.postings, "bm25", lambda *a: order.append("bm25") or bm25(*a))
    monkeypatch.setattr(
        retrieval.knowledge, "embed_query", lambda q: order.append("vector") or embed_query(q)
    )
    assert search(owner, "get user name")
    assert order == ["bm25", "vector"]
