"""GET /api/v1/images/{id} and POST /api/v1/images/{id}/pin: bytes from either tier, sha256-checked, and
the cast (owner, outsider, anonymous)."""

import hashlib

import pytest

from cold_storage.models import ArchivedImage
from cold_storage.services import images_move_to_cold
from cold_storage.storage import COLD, HOT, tier_storage
from tests.cold_storage.helpers import frame, image_part

pytestmark = pytest.mark.django_db


@pytest.fixture
def image(owner, conversation) -> ArchivedImage:
    body = owner.client.post(
        f"/api/v1/conversations/{conversation.id}/messages",
        {"role": "tool", "parts": [image_part(frame(1))]},
        format="json",
    ).json()
    return ArchivedImage.objects.get(pk=body["parts"][0]["image_id"])


def test_get_returns_the_bytes_from_the_hot_tier(owner, image):
    response = owner.client.get(f"/api/v1/images/{image.id}")
    assert response.status_code == 200
    assert response.content == frame(1)
    assert response["Content-Type"] == "image/png"
    assert response["ETag"] == f'"{hashlib.sha256(frame(1)).hexdigest()}"'
    assert response["X-Image-Tier"] == "hot"
    image.refresh_from_db()
    assert image.last_accessed_at is not None


def test_get_returns_the_bytes_from_the_cold_tier(owner, image):
    assert images_move_to_cold(image_ids=[image.id]) == 1
    assert images_move_to_cold(image_ids=[image.id]) == 0  # a second move is a no-op
    image.refresh_from_db()
    assert image.tier == "cold"
    assert not tier_storage(HOT).exists(image.storage_key)
    response = owner.client.get(f"/api/v1/images/{image.id}")
    assert (response.status_code, response.content, response["X-Image-Tier"]) == (200, frame(1), "cold")


def test_a_duplicate_answers_with_its_originals_bytes(owner, conversation, image):
    body = owner.client.post(
        f"/api/v1/conversations/{conversation.id}/messages",
        {"role": "tool", "parts": [image_part(frame(1))]},
        format="json",
    ).json()
    dup = body["parts"][0]["image_id"]
    response = owner.client.get(f"/api/v1/images/{dup}")
    assert response.content == frame(1)
    assert response["X-Image-Duplicate-Of"] == image.id


def test_corrupt_bytes_are_refused(owner, image):
    path = tier_storage(HOT).path(image.storage_key)
    with open(path, "r+b") as handle:
        handle.seek(100)
        handle.write(b"\x00\x01\x02")
    response = owner.client.get(f"/api/v1/images/{image.id}")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "image_corrupt"


def test_purged_bytes_answer_410(owner, image):
    ArchivedImage.objects.filter(pk=image.pk).update(purged_at="2020-01-01T00:00:00Z", storage_key="")
    response = owner.client.get(f"/api/v1/images/{image.id}")
    assert response.status_code == 410
    assert response.json()["error"]["code"] == "image_purged"


def test_outsider_gets_404(outsider, image):
    assert outsider.client.get(f"/api/v1/images/{image.id}").status_code == 404
    response = outsider.client.post(f"/api/v1/images/{image.id}/pin", {}, format="json")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    image.refresh_from_db()
    assert image.pinned is False


def test_anonymous_gets_401(anonymous, image):
    assert anonymous.get(f"/api/v1/images/{image.id}").status_code == 401
    assert anonymous.post(f"/api/v1/images/{image.id}/pin").status_code == 401


def test_unknown_ids_are_404(owner):
    for image_id in ("img_doesnotexist", "../../etc/passwd", "x"):
        assert owner.client.get(f"/api/v1/images/{image_id}").status_code == 404


def test_pin_and_unpin(owner, image):
    response = owner.client.post(f"/api/v1/images/{image.id}/pin")
    assert response.status_code == 200
    assert response.json()["pinned"] is True and response.json()["id"] == image.id
    response = owner.client.post(f"/api/v1/images/{image.id}/pin", {"pinned": False}, format="json")
    assert response.json()["pinned"] is False
    image.refresh_from_db()
    assert image.pinned is False


def test_pinning_a_duplicate_pins_its_original(owner, conversation, image):
    body = owner.client.post(
        f"/api/v1/conversations/{conversation.id}/messages",
        {"role": "tool", "parts": [image_part(frame(1))]},
        format="json",
    ).json()
    owner.client.post(f"/api/v1/images/{body['parts'][0]['image_id']}/pin")
    image.refresh_from_db()
    assert image.pinned is True


@pytest.mark.parametrize(
    ("payload", "code"),
    [({"pinned": "maybe"}, "invalid"), ({"colour": "red"}, "unknown_field"), ([1, 2], "invalid")],
)
def test_pin_bad_input(owner, image, payload, code):
    response = owner.client.post(f"/api/v1/images/{image.id}/pin", payload, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    image.refresh_from_db()
    assert image.pinned is False


def test_cold_storage_is_any_storage_alias(image):
    assert type(tier_storage(COLD)).__name__ == "AtomicFileSystemStorage"
