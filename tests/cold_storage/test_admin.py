"""The images admin and message thumbnails, scoped to the member's tenant."""

import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse

from cold_storage.models import ArchivedImage
from tests.cold_storage.helpers import frame, image_part

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(member) -> Client:
    client = Client()
    client.force_login(member.user)
    return client


def change_url(image) -> str:
    # As the admin links it: admin URLs escape "_" and some other characters in a primary key (quote), and
    # an image id is img_<digits>, so a raw id starting with, e.g., "img_22" would name another object.
    return reverse("admin:cold_storage_archivedimage_change", args=[quote(image.id)])


def store(actor, conversation, seed):
    body = actor.client.post(
        f"/api/v1/conversations/{conversation.id}/messages",
        {"role": "tool", "parts": [image_part(frame(seed))]},
        format="json",
    ).json()
    return ArchivedImage.objects.get(pk=body["parts"][0]["image_id"])


def test_member_sees_own_images_with_thumbnails_and_filters(
    staff, owner, outsider, conversation, outsider_conversation
):
    mine = store(owner, conversation, 1)
    theirs = store(outsider, outsider_conversation, 2)
    page = staff.get("/admin/cold_storage/archivedimage/")
    assert page.status_code == 200
    body = page.content.decode()
    assert mine.id in body and theirs.id not in body
    assert f"/admin/cold_storage/archivedimage/{mine.id}/thumbnail/" in body
    for query in (f"?conversation_id={conversation.id}", "?tier__exact=hot", "?role__exact=process"):
        assert mine.id in staff.get("/admin/cold_storage/archivedimage/" + query).content.decode()
    assert mine.id not in staff.get("/admin/cold_storage/archivedimage/?tier__exact=cold").content.decode()

    thumb = staff.get(f"/admin/cold_storage/archivedimage/{mine.id}/thumbnail/")
    assert thumb.status_code == 200 and thumb["Content-Type"] == "image/png"
    assert staff.get(f"/admin/cold_storage/archivedimage/{theirs.id}/thumbnail/").status_code == 404
    # Another tenant's row "does not exist": back to the index.
    assert staff.get(change_url(theirs)).status_code == 302


def test_member_pins_from_the_admin(staff, owner, conversation):
    image = store(owner, conversation, 1)
    response = staff.post(
        "/admin/cold_storage/archivedimage/",
        {"action": "pin", "_selected_action": [image.id]},
    )
    assert response.status_code == 302
    image.refresh_from_db()
    assert image.pinned is True
    change = staff.get(change_url(image))
    assert change.status_code == 200
    assert "Tier" in change.content.decode() and "Role" in change.content.decode()


def test_messages_show_thumbnails(staff, owner, conversation):
    image = store(owner, conversation, 1)
    page = staff.get(f"/admin/conversations/message/?conversation__id__exact={conversation.id}")
    assert page.status_code == 200
    assert f"{image.id}/thumbnail/" in page.content.decode()
    message_id = image.message_id
    change = staff.get(f"/admin/conversations/message/{message_id}/change/")
    assert f"{image.id}/thumbnail/" in change.content.decode()
