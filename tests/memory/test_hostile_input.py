"""Hostile input to memory: NUL characters, numbers and nesting in task-state events, end-user ids and labels
longer than their columns (or holding a NUL) in the path of every /users/{id}/… route. Each is a 4xx in the
error shape, never a 500, and writes nothing; an outsider gets a 404.

Tests marked postgres failed only there before (a NUL in a WHERE is an error there; SQLite found no row);
they run on both databases, and the 4xx holds on both. The 5,000-character reads were already 404s and are
kept as guards; creating memory for such an id was a 500 on PostgreSQL and stored the id on SQLite."""

import pytest

from memory.models import ArchivalMemory, CoreMemoryBlock, StateEvent
from tenants.models import EndUser
from tenants.validation import MAX_JSON_DEPTH
from tests.memory.helpers import blocks_url, code, patch_block, put_block

pytestmark = pytest.mark.django_db

NUL = "\x00"
LONG_ID = "u" * 5000
EVENT_BODY = '{"expected_epoch":0,"request_id":"r1","event_type":"set","payload":{"path":"a","value":VALUE}}'


def events_url(conversation) -> str:
    return f"/api/v1/conversations/{conversation.id}/state/events"


def event(payload, *, epoch=0, request_id="r1"):
    return {"expected_epoch": epoch, "request_id": request_id, "event_type": "set", "payload": payload}


def assert_error_shape(response, status, error_code):
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    assert set(response.json()["error"]) == {"code", "message", "extra", "request_id"}
    assert code(response) == error_code


# --- task-state events --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        {"path": "a", "value": f"x{NUL}"},
        {"path": "a", "value": {f"k{NUL}": 1}},
        {"path": f"a{NUL}", "value": 1},
    ],
)
def test_nul_in_a_state_event_is_a_400(owner, conversation, payload):
    response = owner.client.post(events_url(conversation), event(payload), format="json")
    assert_error_shape(response, 400, "null_characters_not_allowed")
    assert response.json()["error"]["message"].startswith("payload.")
    assert not StateEvent.objects.exists()


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, 50_000])
def test_a_state_event_nested_too_deep_is_a_400(owner, conversation, depth):
    # With the body and the payload, a value of MAX_JSON_DEPTH levels is two levels too deep.
    value = "[" * depth + "]" * depth
    body = EVENT_BODY.replace("VALUE", value)
    response = owner.client.post(events_url(conversation), body.encode(), content_type="application/json")
    assert_error_shape(response, 400, "json_too_deep")
    assert not StateEvent.objects.exists()


@pytest.mark.parametrize("number", ["1e400", "-1e999"])
def test_a_number_beyond_a_float_in_a_state_event_is_a_400(owner, conversation, number):
    body = EVENT_BODY.replace("VALUE", number)
    response = owner.client.post(events_url(conversation), body.encode(), content_type="application/json")
    assert_error_shape(response, 400, "number_out_of_range")
    assert not StateEvent.objects.exists()


def test_an_expected_epoch_beyond_the_column_is_a_400(owner, conversation):
    response = owner.client.post(
        events_url(conversation), event({"path": "a", "value": 1}, epoch=10**30), format="json"
    )
    assert_error_shape(response, 400, "max_value")


def test_an_outsider_posting_a_hostile_event_gets_404(outsider, conversation):
    response = outsider.client.post(
        events_url(conversation), event({"path": "a", "value": NUL}), format="json"
    )
    assert response.status_code == 404
    assert not StateEvent.objects.exists()


# --- end-user ids and labels in the path --------------------------------------------------------------------

READ_ROUTES = [
    ("delete", "/api/v1/users/{id}"),
    ("get", "/api/v1/users/{id}/export"),
    ("get", "/api/v1/users/{id}/memory/blocks"),
    ("get", "/api/v1/users/{id}/memory/blocks/persona"),
    ("get", "/api/v1/users/{id}/memory/operations"),
    ("get", "/api/v1/users/{id}/memories"),
    ("get", "/api/v1/users/{id}/memories/search?q=x"),
    ("get", "/api/v1/users/{id}/memories/00000000-0000-0000-0000-000000000000"),
    ("delete", "/api/v1/users/{id}/memories/00000000-0000-0000-0000-000000000000"),
]


@pytest.mark.postgres
@pytest.mark.parametrize("external_id", [LONG_ID, "al%00ice"], ids=["5000-chars", "nul"])
@pytest.mark.parametrize(("method", "route"), READ_ROUTES)
def test_an_id_no_end_user_can_have_is_a_404_on_every_users_route(owner, external_id, method, route):
    response = getattr(owner.client, method)(route.format(id=external_id))
    assert response.status_code == 404, response.content[:300]
    assert set(response.json()["error"]) == {"code", "message", "extra", "request_id"}


def test_patching_a_block_of_an_impossible_end_user_is_a_404(owner):
    response = patch_block(owner, "persona", version=1, user=LONG_ID, value="x")
    assert_error_shape(response, 404, "not_found")


@pytest.mark.parametrize("external_id", [LONG_ID, "al%00ice"], ids=["5000-chars", "nul"])
def test_creating_memory_for_an_impossible_end_user_is_a_400(owner, external_id):
    block = put_block(owner, "persona", "Alice.", user=external_id)
    assert_error_shape(block, 400, "invalid_end_user_id")
    assert block.json()["error"]["extra"] == {"max_length": 255}
    memory = owner.client.post(f"/api/v1/users/{external_id}/memories", {"content": "x"}, format="json")
    assert_error_shape(memory, 400, "invalid_end_user_id")
    assert not EndUser.objects.exists()
    assert not CoreMemoryBlock.objects.exists() and not ArchivalMemory.objects.exists()


def test_an_end_user_id_of_exactly_the_column_length_works(owner):
    user = "u" * 255
    assert put_block(owner, "persona", "Alice.", user=user).status_code == 201
    assert owner.client.get(blocks_url(user)).status_code == 200


@pytest.mark.postgres
@pytest.mark.parametrize("label", ["l" * 5000, "pe%00rsona"], ids=["5000-chars", "nul"])
def test_a_label_no_block_can_have_is_a_404_to_read_or_change(owner, label):
    put_block(owner, "persona", "Alice.")
    assert_error_shape(owner.client.get(blocks_url("alice", label)), 404, "not_found")
    assert_error_shape(patch_block(owner, label, version=1, value="x"), 404, "not_found")


@pytest.mark.parametrize(
    "label", ["l" * 5000, "pe%00rsona", "persona%0A"], ids=["5000-chars", "nul", "newline"]
)
def test_a_label_no_block_can_have_is_a_400_to_create(owner, label):
    assert_error_shape(put_block(owner, label, "x"), 400, "invalid_label")
    assert not CoreMemoryBlock.objects.exists()


def test_an_outsider_reading_a_real_users_memory_still_gets_404(owner, outsider):
    put_block(owner, "persona", "Alice.")
    assert outsider.client.get(blocks_url("alice")).status_code == 404
    assert outsider.client.get(blocks_url("alice", "persona")).status_code == 404
    assert outsider.client.get(blocks_url(LONG_ID)).status_code == 404
