"""Image intake: base64 and multipart, validation that stores nothing on refusal, hashing, dedup, token
counts, idempotent replays."""

import pytest

from cold_storage.models import ArchivedImage
from conversations.models import Message
from providers.images import image_tokens
from providers.tokens import count_message, count_text
from tests.cold_storage.conftest import blob_files
from tests.cold_storage.helpers import b64, bmp, bomb_png, frame, gif, image_part, truncated_png

pytestmark = pytest.mark.django_db


def url(conversation):
    return f"/api/v1/conversations/{conversation.id}/messages"


def post(actor, conversation, payload, **headers):
    return actor.client.post(url(conversation), payload, format="json", headers=headers)


def test_base64_image_is_validated_hashed_and_stored(owner, conversation):
    data = frame(1)
    response = post(owner, conversation, {"role": "user", "content": "look", "parts": [image_part(data)]})
    assert response.status_code == 201, response.json()
    part = response.json()["parts"][0]
    assert set(part) == {"type", "image_id", "detail"}
    assert part["image_id"].startswith("img_") and part["detail"] == "auto"
    image = ArchivedImage.objects.get(pk=part["image_id"])
    assert (image.tenant, image.conversation_id, image.tier) == (owner.tenant, conversation.id, "hot")
    assert (image.width, image.height, image.format, image.size) == (320, 200, "PNG", len(data))
    assert str(image.message_id) == response.json()["id"] and image.turn_id is None
    assert len(image.phash) == len(image.dhash) == len(image.ahash) == 16
    assert blob_files() == [f"hot/{image.storage_key}"]
    assert not any(".tmp-" in name for name in blob_files())
    # The message's tokens include the image by the conversation model's rule (gpt-4o: 85 + 170 per tile).
    expected = count_message(role="user", content="look", model="gpt-4o") + image_tokens(
        width=320, height=200, model="gpt-4o"
    )
    assert response.json()["token_count"] == expected == Message.objects.get().token_count


def test_error_role_and_description_are_kept_on_the_stored_part(owner, conversation):
    part = image_part(frame(1), role="error", description="crash dialog", detail="low")
    body = post(owner, conversation, {"role": "tool", "parts": [part]}).json()
    stored = body["parts"][0]
    assert {k: stored[k] for k in ("role", "description", "detail")} == {
        "role": "error",
        "description": "crash dialog",
        "detail": "low",
    }
    assert ArchivedImage.objects.get(pk=stored["image_id"]).role == "error"


def test_a_small_local_change_is_not_a_duplicate_unless_the_grid_guard_is_off(owner, conversation):
    post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1))]})
    # Typing a few characters barely moves the perceptual hash, but moves the brightness grid.
    typed = post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1, marker="abc"))]}).json()
    assert "duplicate_of" not in typed["parts"][0]
    owner.tenant.settings = {"image_dedup_grid_threshold": None}
    owner.tenant.save()
    conversation.refresh_from_db()
    again = post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1, marker="abd"))]}).json()
    assert again["parts"][0]["duplicate_of"] == typed["parts"][0]["image_id"]


def test_the_same_screen_again_is_a_duplicate_with_no_new_bytes(owner, conversation):
    first = post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1))]}).json()
    original = first["parts"][0]["image_id"]
    again = post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1))]})
    assert again.status_code == 201
    part = again.json()["parts"][0]
    assert part["duplicate_of"] == original
    dup = ArchivedImage.objects.get(pk=part["image_id"])
    assert (dup.duplicate_of_id, dup.storage_key, dup.hamming_distance) == (original, "", 0)
    assert len(blob_files()) == 1
    # The model sees one line instead of the pixels, and that is what is counted.
    line = f"screen unchanged since {original}"
    assert (
        again.json()["token_count"]
        == count_message(role="tool", content="", model="gpt-4o") + count_text(line, model="gpt-4o") + 1
    )
    # A third copy still points at the original, not at the duplicate.
    third = post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1))]}).json()
    assert third["parts"][0]["duplicate_of"] == original


def test_a_different_screen_is_stored(owner, conversation):
    post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1))]})
    body = post(owner, conversation, {"role": "tool", "parts": [image_part(frame(2))]}).json()
    assert "duplicate_of" not in body["parts"][0]
    assert len(blob_files()) == 2


def test_dedup_is_per_conversation(owner, conversation):
    from conversations.services import conversation_create

    post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1))]})
    other = conversation_create(tenant=owner.tenant)
    body = post(owner, other, {"role": "tool", "parts": [image_part(frame(1))]}).json()
    assert "duplicate_of" not in body["parts"][0]


@pytest.mark.parametrize("algorithm", ["phash", "dhash", "ahash"])
def test_tenant_chooses_algorithm_and_threshold(owner, conversation, algorithm):
    owner.tenant.settings = {"image_hash_algorithm": algorithm, "image_dedup_threshold": 0}
    owner.tenant.save()
    conversation.refresh_from_db()
    post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1))]})
    body = post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1))]}).json()
    assert "duplicate_of" in body["parts"][0]
    body = post(owner, conversation, {"role": "tool", "parts": [image_part(frame(3))]}).json()
    assert "duplicate_of" not in body["parts"][0]


def test_dedup_can_be_switched_off(owner, conversation):
    owner.tenant.settings = {"image_dedup": False}
    owner.tenant.save()
    conversation.refresh_from_db()
    post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1))]})
    body = post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1))]}).json()
    assert "duplicate_of" not in body["parts"][0]
    assert len(blob_files()) == 2


def test_images_inside_a_tool_result_are_stored_too(owner, conversation):
    parts = [
        {
            "type": "tool_result",
            "tool_call_id": "c1",
            "is_error": True,
            "content": [{"type": "text", "text": "clicked"}, image_part(frame(4))],
        }
    ]
    body = post(owner, conversation, {"role": "tool", "parts": parts}).json()
    nested = body["parts"][0]["content"][1]
    image = ArchivedImage.objects.get(pk=nested["image_id"])
    assert image.role == "error"  # carried by an error result


def test_multipart_upload(owner, conversation):
    import io
    import json

    message = {
        "role": "user",
        "content": "two screens",
        "parts": [
            {"type": "image", "upload": "first"},
            {"type": "image", "upload": "second", "detail": "high"},
        ],
    }
    first, second = io.BytesIO(frame(5)), io.BytesIO(frame(6))
    first.name, second.name = "a.png", "b.png"
    response = owner.client.post(
        url(conversation),
        {"message": json.dumps(message), "first": first, "second": second},
        format="multipart",
    )
    assert response.status_code == 201, response.json()
    parts = response.json()["parts"]
    assert [p["detail"] for p in parts] == ["auto", "high"]
    assert ArchivedImage.objects.count() == 2 and len(blob_files()) == 2


def test_multipart_batch(owner, conversation):
    import io
    import json

    batch = {
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "tool", "parts": [{"type": "image", "upload": "shot"}]},
        ]
    }
    shot = io.BytesIO(frame(7))
    shot.name = "shot.png"
    response = owner.client.post(
        url(conversation), {"message": json.dumps(batch), "shot": shot}, format="multipart"
    )
    assert response.status_code == 201, response.json()
    assert response.json()["messages"][1]["parts"][0]["image_id"].startswith("img_")


@pytest.mark.parametrize(
    ("form", "code"),
    [
        ({}, "required"),
        ({"message": "{not json"}, "malformed_json"),
        ({"message": '{"role": "user", "content": "x"}', "colour": "red"}, "unknown_field"),
        ({"message": '{"role": "user", "parts": [{"type": "image", "upload": "nope"}]}'}, "invalid_image"),
    ],
)
def test_bad_multipart_is_a_400_and_stores_nothing(owner, conversation, form, code):
    response = owner.client.post(url(conversation), form, format="multipart")
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["code"] == code
    assert not Message.objects.exists() and not ArchivedImage.objects.exists()


def test_an_existing_image_can_be_referenced_within_the_tenant(
    owner, outsider, conversation, outsider_conversation
):
    stored = post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1))]}).json()
    image_id = stored["parts"][0]["image_id"]
    ref = post(owner, conversation, {"role": "user", "parts": [{"type": "image", "image_id": image_id}]})
    assert ref.status_code == 201
    assert ref.json()["parts"] == [{"type": "image", "image_id": image_id}]
    assert ref.json()["token_count"] == count_message(role="user", content="", model="gpt-4o") + image_tokens(
        width=320, height=200, model="gpt-4o"
    )
    # Another tenant cannot name it.
    response = outsider.client.post(
        url(outsider_conversation),
        {"role": "user", "parts": [{"type": "image", "image_id": image_id}]},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_image"
    assert not Message.objects.filter(conversation=outsider_conversation).exists()


BAD_IMAGES = [
    pytest.param({"data": b64(b"this is not an image")}, "invalid_image", id="not-an-image"),
    pytest.param({"data": b64(truncated_png())}, "invalid_image", id="truncated-png"),
    pytest.param({"data": b64(gif()), "media_type": "image/gif"}, "image_format_not_allowed", id="gif"),
    pytest.param({"data": b64(bmp())}, "image_format_not_allowed", id="bmp"),
    pytest.param({"data": b64(bomb_png())}, "image_too_large", id="bomb-over-pillow-limit"),
    pytest.param({"data": b64(bomb_png(5000, 5000))}, "image_too_large", id="over-pixel-limit"),
    pytest.param({"data": "%%% not base64 %%%"}, "invalid_image", id="bad-base64"),
    pytest.param({"data": ""}, "invalid_image", id="empty"),
    pytest.param({"data": b64(frame(1)), "media_type": "image/jpeg"}, "invalid_image", id="media-type-lies"),
    pytest.param({"image_id": "img_doesnotexist"}, "invalid_image", id="unknown-image-id"),
    pytest.param(
        {"image_id": "img_abc123", "duplicate_of": "img_abc123"}, "invalid_parts", id="server-field"
    ),
    pytest.param({"data": b64(frame(1)), "image_id": "img_abc123"}, "invalid_parts", id="two-sources"),
    pytest.param({}, "invalid_parts", id="no-source"),
    pytest.param({"data": b64(frame(1)), "role": "anchor"}, "invalid_parts", id="bad-role"),
]


@pytest.mark.parametrize(("fields", "code"), BAD_IMAGES)
def test_bad_image_is_a_400_with_a_code_and_stores_nothing(owner, conversation, fields, code):
    batch = {
        "messages": [
            {"role": "tool", "parts": [image_part(frame(1))]},  # a good image first: it must not stay either
            {"role": "tool", "parts": [{"type": "image", **fields}]},
        ]
    }
    response = post(owner, conversation, batch)
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["code"] == code
    assert not Message.objects.exists()
    assert not ArchivedImage.objects.exists()
    assert blob_files() == []


def test_per_image_byte_limit(owner, conversation, settings):
    settings.MNEMO_IMAGE_MAX_BYTES = 100
    response = post(owner, conversation, {"role": "tool", "parts": [image_part(frame(1))]})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "image_too_large"
    assert blob_files() == []


def test_a_failure_after_the_bytes_were_written_removes_them(owner, conversation):
    post(owner, conversation, {"role": "user", "content": "taken", "idempotency_key": "k"})
    batch = {
        "messages": [
            {"role": "tool", "parts": [image_part(frame(1))]},
            {"role": "user", "content": "different", "idempotency_key": "k"},  # 409 after message 0 stored
        ]
    }
    response = post(owner, conversation, batch)
    assert response.status_code == 409
    assert not ArchivedImage.objects.exists()
    assert blob_files() == []
    assert Message.objects.count() == 1


def test_an_image_message_is_not_limited_by_the_message_size(owner, conversation, settings):
    settings.MNEMO_MAX_MESSAGE_BYTES = 2000
    data = frame(1, size=(640, 400))
    assert len(b64(data)) > 2000
    assert post(owner, conversation, {"role": "tool", "parts": [image_part(data)]}).status_code == 201


def test_a_retried_append_with_the_same_image_returns_the_original(owner, conversation):
    body = {"role": "tool", "parts": [image_part(frame(1))]}
    first = post(owner, conversation, body, **{"Idempotency-Key": "shot-1"})
    again = post(owner, conversation, body, **{"Idempotency-Key": "shot-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert ArchivedImage.objects.count() == 1 and len(blob_files()) == 1
    other = {"role": "tool", "parts": [image_part(frame(2))]}
    conflict = post(owner, conversation, other, **{"Idempotency-Key": "shot-1"})
    assert conflict.status_code == 409
    assert ArchivedImage.objects.count() == 1 and len(blob_files()) == 1


def test_editing_parts_cannot_bring_new_image_bytes(owner, conversation):
    message = post(owner, conversation, {"role": "assistant", "content": "", "completed": False}).json()
    response = owner.client.patch(
        f"{url(conversation)}/{message['id']}", {"parts": [image_part(frame(1))]}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_parts"
    assert blob_files() == []
