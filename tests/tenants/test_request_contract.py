"""Requests the OpenAPI schema calls invalid are refused, as schemathesis (make schema-check) found they were
not: a value of the wrong JSON type that DRF coerced (0 -> "0", false -> 0.0), text over its maxLength once
trimmed, an empty list parameter read as absent, a JSON null where a body may be left out, and a part type
that is not a string (500)."""

import pytest

from conversations.models import Message
from conversations.services import message_append_batch
from memory.models import ArchivalMemory
from tests.cold_storage.helpers import frame, image_part

pytestmark = pytest.mark.django_db


def error(response, status):
    assert response.status_code == status, response.content[:300]
    return response.json()["error"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "ops", "policy": 0}, "policy"),
        ({"name": 7}, "name"),
        ({"name": "ops", "is_default": False, "scope": True}, "scope"),
    ],
)
def test_a_number_or_boolean_for_text_is_refused(owner, body, field):
    err = error(owner.client.post("/api/v1/agent-profiles", body, format="json"), 400)
    assert err["extra"]["fields"][field][0]["code"] == "invalid"


def test_a_boolean_for_a_number_and_a_number_in_a_text_list_are_refused(owner):
    url = "/api/v1/users/alice/memories"
    bad_importance = owner.client.post(url, {"content": "x", "importance": False}, format="json")
    assert error(bad_importance, 400)["extra"]["fields"]["importance"][0]["code"] == "invalid"
    bad_ids = owner.client.post(url, {"content": "x", "source_message_ids": ["a", 0]}, format="json")
    assert "source_message_ids" in error(bad_ids, 400)["extra"]["fields"]
    assert not ArchivalMemory.objects.exists()
    ok = owner.client.post(url, {"content": "x", "importance": 1, "source_message_ids": ["a"]}, format="json")
    assert ok.status_code == 201  # an integer is a number


def test_text_over_its_max_length_is_refused_before_trimming(owner):
    body = {"end_user": "alice" + "\u000b" * 300}  # 305 characters; 5 once trimmed
    err = error(owner.client.post("/api/v1/conversations", body, format="json"), 400)
    assert err["extra"]["fields"]["end_user"][0]["code"] == "max_length"
    assert (
        owner.client.post("/api/v1/conversations", {"end_user": " alice "}, format="json").status_code == 201
    )


@pytest.mark.parametrize("query", ["limit=", "limit=0", "limit=x"])
def test_an_empty_or_bad_limit_is_refused_not_ignored(owner, conversation, query):
    for path in ("conversations", f"conversations/{conversation.id}/messages"):
        assert error(owner.client.get(f"/api/v1/{path}?{query}"), 400)["code"] in {"invalid", "min_value"}


def test_a_part_type_that_is_not_a_string_is_a_400_not_a_500(owner, conversation):
    url = f"/api/v1/conversations/{conversation.id}/messages"
    posted = owner.client.post(url, {"role": "user", "parts": [{"type": {}}]}, format="json")
    assert error(posted, 400)["code"] == "invalid_parts"
    [stored] = message_append_batch(conversation=conversation, items=[{"role": "user", "completed": False}])
    patch = owner.client.patch(f"{url}/{stored.message.id}", {"parts": [{"type": ["text"]}]}, format="json")
    assert error(patch, 400)["code"] == "invalid_parts"
    assert Message.objects.get(pk=stored.message.pk).parts == []


def test_a_null_body_is_refused_where_the_body_may_be_left_out(owner, outsider, conversation):
    compact = f"/api/v1/conversations/{conversation.id}/compact"
    null = {"data": "null", "content_type": "application/json"}
    assert error(owner.client.post(compact, **null), 400)["code"] == "null"
    url = f"/api/v1/conversations/{conversation.id}/messages"
    message = owner.client.post(url, {"role": "user", "parts": [image_part(frame(1))]}, format="json")
    image_id = message.json()["parts"][0]["image_id"]
    pin = f"/api/v1/images/{image_id}/pin"
    assert error(owner.client.post(pin, **null), 400)["code"] == "null"
    assert owner.client.post(pin).json()["pinned"] is True  # no body: the default
    assert outsider.client.post(pin, **null).status_code == 404
    assert outsider.client.post(compact, **null).status_code == 404
