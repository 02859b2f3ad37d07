"""A document whose processing task was lost (the broker never took it, a stopped server's queue) is
processed by the periodic sweep once no task of its own can still be running; a recent one is left alone."""

from datetime import timedelta

import pytest
from django.utils import timezone

from knowledge.models import Document
from knowledge.tasks import document_process_task, documents_pending_sweep

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def lexical_only(settings):
    settings.MNEMO_EMBEDDINGS = "none"


def lost_upload(actor, name):
    """An upload whose on-commit processing never ran: the document stays pending."""
    response = actor.client.post("/api/v1/documents", {"file": [_file(name)]}, format="multipart")
    assert response.status_code == 201, response.content
    [document] = response.json()["documents"]
    return Document.objects.get(pk=document["id"])


def _file(name):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(name, f"# {name}\n\nThe staging database listens on port 6543.\n".encode())


def test_a_document_left_pending_is_processed_by_the_sweep_and_a_recent_one_waits(owner, outsider):
    old = lost_upload(owner, "old.md")
    theirs = lost_upload(outsider, "theirs.md")
    recent = lost_upload(owner, "recent.md")
    past = timezone.now() - timedelta(seconds=document_process_task.time_limit + 200)
    Document.objects.filter(pk__in=[old.pk, theirs.pk]).update(created_at=past)
    assert documents_pending_sweep() == 2  # every tenant's
    statuses = dict(Document.objects.values_list("pk", "status"))
    assert statuses[old.pk] == statuses[theirs.pk] == Document.Status.READY
    assert statuses[recent.pk] == Document.Status.PENDING
    assert documents_pending_sweep() == 0
