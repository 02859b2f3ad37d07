"""POST/GET/DELETE /api/v1/documents and /chunks: scopes, dedup, processing, limits, failures, outsiders."""

import pytest
from django.test import override_settings

from knowledge.models import Chunk, Document
from tests.knowledge.conftest import code, document_files, upload
from tests.knowledge.files import docx_bytes, pdf_bytes

pytestmark = pytest.mark.django_db(transaction=False)

NOTES = b"# Runbook\n\nRestart the ingest worker with `systemctl restart ingest`.\n"


def test_upload_processes_a_document_to_ready(owner, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = upload(owner, ("runbook.md", NOTES))
    assert response.status_code == 201, response.json()
    [row] = response.json()["documents"]
    assert row["status"] == "pending" and row["duplicate"] is False and row["scope"] == "tenant"
    detail = owner.client.get(f"/api/v1/documents/{row['id']}").json()
    assert detail["status"] == "ready" and detail["error"] is None
    assert detail["format"] == "markdown" and detail["kind"] == "document"
    assert detail["chunk_count"] == 1 and detail["token_count"] > 0
    assert len(document_files()) == 1  # the bytes are in storage, not the database


def test_several_files_in_one_request_and_one_failure_does_not_sink_the_rest(
    owner, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = upload(
            owner,
            ("spec.pdf", pdf_bytes([["The API answers within 200 ms."]])),
            ("broken.pdf", b"%PDF-1.4\nthis is not a pdf at all"),
            ("notes.docx", docx_bytes()),
        )
    assert response.status_code == 201
    ids = [row["id"] for row in response.json()["documents"]]
    states = {d.name: d for d in Document.objects.filter(pk__in=ids)}
    assert states["spec.pdf"].status == "ready"
    assert states["notes.docx"].status == "ready"
    broken = owner.client.get(f"/api/v1/documents/{states['broken.pdf'].pk}").json()
    assert broken["status"] == "failed"
    assert broken["error"]["code"] == "corrupt_file" and "PDF" in broken["error"]["message"]
    assert not Chunk.objects.filter(document_id=states["broken.pdf"].pk).exists()


def test_unsupported_type_fails_at_once_with_a_reason(owner):
    response = upload(owner, ("photo.bin", b"\x00\x01\x02binary\x00" * 10))
    [row] = response.json()["documents"]
    assert row["status"] == "failed" and row["error"]["code"] == "unsupported_type"


def test_same_bytes_in_the_same_scope_answer_with_the_same_document(owner, conversation):
    first = upload(owner, ("a.md", NOTES)).json()["documents"][0]
    again = upload(owner, ("renamed.md", NOTES)).json()["documents"][0]
    assert again["id"] == first["id"] and again["duplicate"] is True
    elsewhere = upload(owner, ("a.md", NOTES), conversation=str(conversation.pk)).json()["documents"][0]
    assert elsewhere["id"] != first["id"] and elsewhere["scope"] == "conversation"
    assert Document.objects.filter(tenant=owner.tenant).count() == 2


def test_scopes_end_user_and_conversation(owner, conversation):
    by_user = upload(owner, ("u.md", b"user notes"), end_user="bob").json()["documents"][0]
    assert by_user["scope"] == "end_user" and by_user["end_user"] == "bob"
    in_conv = upload(owner, ("c.md", b"conv notes"), conversation=str(conversation.pk)).json()["documents"][0]
    assert in_conv["conversation"] == str(conversation.pk) and in_conv["end_user"] == "alice"
    mismatch = upload(owner, ("x.md", b"x"), conversation=str(conversation.pk), end_user="bob")
    assert mismatch.status_code == 400 and code(mismatch) == "scope_mismatch"


def test_list_filters(owner, conversation):
    upload(owner, ("t.md", b"tenant wide"))
    upload(owner, ("u.md", b"for bob"), end_user="bob")
    upload(owner, ("c.py", b"def f():\n    return 1\n"), conversation=str(conversation.pk))

    def names(query):
        return sorted(d["name"] for d in owner.client.get(f"/api/v1/documents{query}").json()["results"])

    assert names("") == ["c.py", "t.md", "u.md"]
    assert names("?scope=tenant") == ["t.md"]
    assert names("?end_user=bob") == ["u.md"]
    assert names(f"?conversation={conversation.pk}") == ["c.py"]
    assert names("?kind=code") == ["c.py"]
    assert names("?status=failed") == []
    bad = owner.client.get("/api/v1/documents?status=done")
    assert bad.status_code == 400 and code(bad) == "invalid_choice"


def test_chunks_with_provenance_and_paging(owner):
    pages = [[f"Page {n} says the launch code is {n * 111}."] for n in range(1, 4)]
    document = upload(owner, ("deck.pdf", pdf_bytes(pages))).json()["documents"][0]
    body = owner.client.get(f"/api/v1/documents/{document['id']}/chunks").json()
    assert [c["page"] for c in body["chunks"]] == [1, 2, 3]
    assert "launch code is 222" in body["chunks"][1]["content"]
    assert all(c["token_count"] > 0 for c in body["chunks"])
    after = owner.client.get(f"/api/v1/documents/{document['id']}/chunks?after=0&limit=1").json()
    assert [c["page"] for c in after["chunks"]] == [2]


def test_delete_removes_rows_chunks_and_bytes(owner, django_capture_on_commit_callbacks):
    document = upload(owner, ("a.md", NOTES)).json()["documents"][0]
    assert Chunk.objects.filter(document_id=document["id"]).exists() and document_files()
    with django_capture_on_commit_callbacks(execute=True):
        response = owner.client.delete(f"/api/v1/documents/{document['id']}")
    assert response.status_code == 204
    assert not Chunk.objects.filter(document_id=document["id"]).exists()
    assert document_files() == []
    assert owner.client.get(f"/api/v1/documents/{document['id']}").status_code == 404


def test_conversation_delete_takes_its_documents_bytes(
    owner, conversation, django_capture_on_commit_callbacks
):
    from conversations.services import conversation_delete

    upload(owner, ("a.md", NOTES), conversation=str(conversation.pk))
    with django_capture_on_commit_callbacks(execute=True):
        conversation_delete(conversation=conversation)
    assert not Document.objects.exists() and document_files() == []


def test_limits_refuse_the_whole_request(owner):
    with override_settings(MNEMO_DOCUMENT_MAX_BYTES=10):
        response = upload(owner, ("ok.md", b"tiny"), ("big.md", b"x" * 11))
    assert response.status_code == 413 and code(response) == "document_too_large"
    assert response.json()["error"]["extra"]["name"] == "big.md"
    assert not Document.objects.exists() and document_files() == []
    with override_settings(MNEMO_DOCUMENT_MAX_FILES=1):
        response = upload(owner, ("a.md", b"a"), ("b.md", b"b"))
    assert response.status_code == 400 and code(response) == "too_many_files"
    owner.tenant.settings = {"document_max_bytes": 3}
    owner.tenant.save()
    assert code(upload(owner, ("c.md", b"four"))) == "document_too_large"


def test_request_over_the_body_limit_is_413(owner):
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=2048):
        response = upload(owner, ("a.md", b"x" * 5000))
    assert response.status_code == 413 and code(response) == "request_too_large"


def test_bad_requests(owner):
    assert code(owner.client.post("/api/v1/documents", {}, format="multipart")) == "no_files"
    assert code(upload(owner, ("empty.md", b""))) == "empty_file"
    assert code(upload(owner, ("a.md", b"a"), colour="red")) == "unknown_field"
    assert code(upload(owner, ("a.md", b"a"), conversation="nope")) == "invalid"
    json_post = owner.client.post("/api/v1/documents", {"file": "x"}, format="json")
    assert json_post.status_code == 415
    assert owner.client.get("/api/v1/documents/not-a-uuid").status_code == 404


def test_processing_error_fails_the_document_instead_of_leaving_it_pending(owner, monkeypatch):
    from knowledge import processing

    def explode(**kwargs):
        raise RuntimeError("reader bug")

    monkeypatch.setattr(processing, "ingest", explode)
    document = upload(owner, ("a.md", NOTES)).json()["documents"][0]
    detail = owner.client.get(f"/api/v1/documents/{document['id']}").json()
    assert detail["status"] == "failed" and detail["error"]["code"] == "processing_error"


def test_outsider_sees_nothing(owner, outsider, conversation):
    document = upload(owner, ("a.md", NOTES)).json()["documents"][0]
    url = f"/api/v1/documents/{document['id']}"
    assert outsider.client.get(url).status_code == 404
    assert outsider.client.get(f"{url}/chunks").status_code == 404
    assert outsider.client.delete(url).status_code == 404
    assert outsider.client.get("/api/v1/documents").json()["results"] == []
    # Nor can it upload into the owner's conversation.
    response = upload(outsider, ("x.md", b"x"), conversation=str(conversation.pk))
    assert response.status_code == 404
    assert Document.objects.filter(tenant=outsider.tenant).count() == 0
    assert Document.objects.filter(pk=document["id"]).exists()


def test_anonymous_is_refused(anonymous):
    assert anonymous.get("/api/v1/documents").status_code == 401
    assert anonymous.post("/api/v1/knowledge/search", {"query": "x"}, format="json").status_code == 401
