"""Core memory over the API: versions with If-Match/ETag, character limits, the operation log, and what an
outsider, an anonymous client and bad input get."""

import pytest

from memory.models import CoreMemoryBlock, CoreMemoryBlockVersion, MemoryOperation
from tests.memory.helpers import blocks_url, code, patch_block, put_block

pytestmark = pytest.mark.django_db


def test_put_creates_then_needs_the_version_it_read(owner, conversation):
    created = put_block(owner, "persona", "Alice is a release manager.", reason="onboarding")
    assert created.status_code == 201, created.content
    assert created["ETag"] == '"1"'
    assert created.json()["version"] == 1

    assert code(put_block(owner, "persona", "no version")) == "if_match_required"
    stale = put_block(owner, "persona", "stale", version=7)
    assert stale.status_code == 412
    assert code(stale) == "version_mismatch"
    assert stale.json()["error"]["extra"]["version"] == 1

    updated = put_block(owner, "persona", "Alice manages releases and on-call.", version=1)
    assert updated.status_code == 200
    assert updated["ETag"] == '"2"'
    block = CoreMemoryBlock.objects.get(label="persona")
    assert (block.version, block.value) == (2, "Alice manages releases and on-call.")
    assert CoreMemoryBlockVersion.objects.filter(block=block).count() == 2


def test_two_writers_on_the_same_version_cannot_both_win(owner, conversation):
    put_block(owner, "preferences", "short answers")
    first = put_block(owner, "preferences", "short answers, in German", version=1)
    second = put_block(owner, "preferences", "long answers", version=1)
    assert first.status_code == 200
    assert second.status_code == 412
    assert CoreMemoryBlock.objects.get(label="preferences").value == "short answers, in German"


def test_over_the_char_limit_is_a_422_and_nothing_changes(owner, conversation):
    put_block(owner, "profile", "ok", char_limit=10)
    response = put_block(owner, "profile", "x" * 11, version=1)
    assert response.status_code == 422
    assert code(response) == "over_char_limit"
    assert response.json()["error"]["extra"] == {"length": 11, "char_limit": 10}
    assert code(patch_block(owner, "profile", version=1, append="0123456789")) == "over_char_limit"
    assert CoreMemoryBlock.objects.get(label="profile").version == 1


def test_patch_appends_and_resizes(owner, conversation):
    put_block(owner, "preferences", "likes tea")
    response = patch_block(owner, "preferences", version=1, append="dislikes meetings", reason="said so")
    assert response.status_code == 200, response.content
    assert response.json()["value"] == "likes tea\ndislikes meetings"
    assert response["ETag"] == '"2"'
    assert patch_block(owner, "preferences", version=2, char_limit=500).json()["char_limit"] == 500
    assert patch_block(owner, "missing", version=1, value="x").status_code == 404
    assert code(patch_block(owner, "preferences", version=3)) == "nothing_to_change"


def test_get_lists_blocks_in_render_order_and_one_with_its_etag(owner, conversation):
    for label in ("zeta", "profile", "alpha", "persona", "preferences"):
        assert put_block(owner, label, f"{label} text").status_code == 201
    labels = [b["label"] for b in owner.client.get(blocks_url()).json()["blocks"]]
    assert labels == ["persona", "preferences", "profile", "alpha", "zeta"]
    one = owner.client.get(blocks_url(label="alpha"))
    assert one.status_code == 200 and one["ETag"] == '"1"'
    assert owner.client.get(blocks_url(label="nope")).status_code == 404


def test_operations_log_old_new_who_and_why(owner, conversation):
    put_block(owner, "persona", "v1", reason="first")
    put_block(owner, "persona", "v2", version=1, reason="correction")
    ops = owner.client.get("/api/v1/users/alice/memory/operations").json()["operations"]
    assert [(o["op"], o["old_value"], o["new_value"], o["trigger"], o["actor"]) for o in ops] == [
        ("core_memory_update", "v1", "v2", "correction", "api"),
        ("core_memory_create", "", "v1", "first", "api"),
    ]
    assert ops[0]["actor_name"] == "api_key:default"
    filtered = owner.client.get("/api/v1/users/alice/memory/operations?target=core:other&limit=5")
    assert filtered.json()["operations"] == []


@pytest.mark.parametrize(
    "label, body, status, error",
    [
        ("Bad Label", {"value": "x"}, 400, "invalid_label"),
        ("persona", {"value": "x", "colour": "red"}, 400, "unknown_field"),
        ("persona", {}, 400, "required"),
        ("persona", {"value": "x", "char_limit": 0}, 400, "min_value"),
    ],
)
def test_bad_input_is_a_400(owner, conversation, label, body, status, error):
    response = owner.client.put(blocks_url(label=label), body, format="json")
    assert response.status_code == status
    assert error in response.content.decode()


def test_bad_if_match_is_a_400(owner, conversation):
    put_block(owner, "persona", "x")
    response = owner.client.put(
        blocks_url(label="persona"), {"value": "y"}, format="json", HTTP_IF_MATCH="abc"
    )
    assert code(response) == "invalid_if_match"


def test_outsider_and_anonymous_get_nothing(owner, outsider, anonymous, conversation):
    put_block(owner, "persona", "secret")
    assert outsider.client.get(blocks_url()).status_code == 404
    assert outsider.client.get(blocks_url(label="persona")).status_code == 404
    assert patch_block(outsider, "persona", version=1, value="pwned").status_code == 404
    assert outsider.client.get("/api/v1/users/alice/memory/operations").status_code == 404
    # A PUT from the outsider writes into the outsider's own namespace, never the owner's.
    assert put_block(outsider, "persona", "mine").status_code == 201
    assert CoreMemoryBlock.objects.get(tenant=owner.tenant).value == "secret"
    for response in (
        anonymous.get(blocks_url()),
        anonymous.get(blocks_url(label="persona")),
        anonymous.put(blocks_url(label="persona"), {"value": "x"}, format="json"),
        anonymous.patch(blocks_url(label="persona"), {"value": "x"}, format="json"),
        anonymous.get("/api/v1/users/alice/memory/operations"),
    ):
        assert response.status_code == 401
    assert MemoryOperation.objects.filter(tenant=owner.tenant).count() == 1
