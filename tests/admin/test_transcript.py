"""a conversation's change page shows its transcript, paginated, with roles, image thumbnails,
partial replies and compaction boundaries marked (it showed only a link "14 messages")."""

import pytest
from django.urls import reverse

from cold_storage.models import ArchivedImage
from conversations.services import message_append_batch
from tenants.models import Membership
from tests.cold_storage.helpers import frame, image_part
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def long_conversation(owner, conversation):
    items = []
    for i in range(30):
        items.append({"role": "user", "content": f"Question {i}: which build?"})
        items.append({"role": "assistant", "content": f"Build {4100 + i}.\nAll checks pass."})
    message_append_batch(conversation=conversation, items=items)
    url = f"/api/v1/conversations/{conversation.id}/compact"
    assert owner.client.post(url, {}, format="json").status_code == 200
    base = f"/api/v1/conversations/{conversation.id}/messages"
    parts = [{"type": "text", "text": "The screen:"}, image_part(frame(3))]
    owner.client.post(base, {"role": "user", "content": "", "parts": parts}, format="json")
    owner.client.post(base, {"role": "assistant", "content": "It shows", "completed": False}, format="json")
    return conversation


def page(client, conversation, number=None):
    url = reverse("admin:conversations_conversation_change", args=[conversation.pk])
    response = client.get(url, {"transcript_page": number} if number else {})
    assert response.status_code == 200
    return response.content.decode()


def test_the_transcript_pages_through_the_conversation(client, member, long_conversation):
    client.force_login(member.user)
    first = page(client, long_conversation)
    assert 'id="transcript"' in first
    assert "Transcript: messages 1–50 of 64" in first
    assert "Question 0: which build?" in first and "<strong>assistant</strong>" in first
    assert "Question 29" not in first
    last = page(client, long_conversation, 2)
    assert "Transcript: messages 51–64 of 64" in last
    assert "Question 29: which build?" in last


def test_the_transcript_marks_boundaries_summaries_partial_replies_and_shows_images(
    client, member, long_conversation
):
    client.force_login(member.user)
    html = page(client, long_conversation, 2)
    assert 'class="mnemo-boundary"' in html and "Compacted here" in html
    assert "compaction summary" in html
    assert "partial: the reply was cut off" in html
    image = ArchivedImage.objects.get(conversation_id=long_conversation.pk)
    assert f"{image.id}/thumbnail/" in html
    assert "The screen:" in html


def test_support_reads_the_transcript_and_no_other_tenants(
    client, owner, long_conversation, outsider_conversation
):
    support = MembershipFactory(tenant=owner.tenant, role=Membership.Role.SUPPORT)
    client.force_login(support.user)
    assert "Question 0" in page(client, long_conversation)
    url = reverse("admin:conversations_conversation_change", args=[outsider_conversation.pk])
    assert client.get(url).status_code == 302  # Django's "doesn't exist" redirect to the index
