"""Admin: documents with scope, status, size and chunk count, a read-only chunk viewer, delete by operators
(bytes, chunks and vectors go), and nothing of another tenant."""

import pytest
from django.test import TestCase
from django.urls import reverse

from knowledge.models import Chunk, Document
from tenants.models import Membership
from tests.factories import MembershipFactory
from tests.knowledge.conftest import document_files, upload
from tests.knowledge.files import PYTHON_SOURCE

pytestmark = pytest.mark.django_db


@pytest.fixture
def document(owner) -> Document:
    row = upload(owner, ("billing.py", PYTHON_SOURCE)).json()["documents"][0]
    return Document.objects.get(pk=row["id"])


def test_list_and_chunk_viewer(client, owner, member, document):
    client.force_login(member.user)
    listing = client.get(reverse("admin:knowledge_document_changelist")).content.decode()
    assert "billing.py" in listing and "ready" in listing.lower()
    page = client.get(reverse("admin:knowledge_document_change", args=[document.pk])).content.decode()
    assert "billing.py · lines 14-16 · Invoice.render_invoice" in page
    chunk = Chunk.objects.filter(document=document).first()
    viewer = client.get(reverse("admin:knowledge_chunk_change", args=[chunk.pk]))
    assert viewer.status_code == 200
    assert (
        client.post(reverse("admin:knowledge_chunk_delete", args=[chunk.pk]), {"post": "yes"}).status_code
        == 403
    )


def test_operator_delete_removes_bytes_chunks_and_vectors(client, member, document):
    client.force_login(member.user)
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post(
            reverse("admin:knowledge_document_delete", args=[document.pk]), {"post": "yes"}
        )
    assert response.status_code == 302
    assert not Document.objects.exists() and not Chunk.objects.exists() and document_files() == []


def test_support_cannot_delete_and_outsiders_see_nothing(client, owner, outsider, document):
    support = MembershipFactory(tenant=owner.tenant, role=Membership.Role.SUPPORT)
    client.force_login(support.user)
    assert client.get(reverse("admin:knowledge_document_change", args=[document.pk])).status_code == 200
    delete = client.post(reverse("admin:knowledge_document_delete", args=[document.pk]), {"post": "yes"})
    assert delete.status_code == 403 and Document.objects.exists()
    stranger = MembershipFactory(tenant=outsider.tenant, role=Membership.Role.OPERATOR)
    client.force_login(stranger.user)
    assert "billing.py" not in client.get(reverse("admin:knowledge_document_changelist")).content.decode()
    page = client.get(reverse("admin:knowledge_document_change", args=[document.pk]))
    assert page.status_code == 302  # the admin's "does not exist" redirect
    chunk = Chunk.objects.filter(document=document).first()
    assert client.get(reverse("admin:knowledge_chunk_change", args=[chunk.pk])).status_code == 302


def test_image_descriptions_are_read_only_and_tenant_scoped(client, owner, outsider, member):
    from knowledge.models import ImageDescription

    mine = ImageDescription.objects.create(
        tenant=owner.tenant, sha256="a" * 64, text="A login form.", model="m"
    )
    theirs = ImageDescription.objects.create(
        tenant=outsider.tenant, sha256="b" * 64, text="Theirs.", model="m"
    )
    client.force_login(member.user)
    listing = client.get(reverse("admin:knowledge_imagedescription_changelist")).content.decode()
    assert "A login form." in listing and "Theirs." not in listing
    assert client.get(reverse("admin:knowledge_imagedescription_change", args=[mine.pk])).status_code == 200
    other = client.get(reverse("admin:knowledge_imagedescription_change", args=[theirs.pk]))
    assert other.status_code == 302  # the admin's "does not exist" redirect
    delete = reverse("admin:knowledge_imagedescription_delete", args=[mine.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert ImageDescription.objects.filter(pk=mine.pk).exists()
