"""B2a in the context pipeline: fixed order and format, and the prefix-cache rule — an edit between
compaction boundaries leaves the system message byte-identical and reaches the model as a memory update;
at the next boundary it is folded into B2a."""

import pytest

from context.receivers import fold_core_memory
from memory.models import CoreMemorySnapshot
from summaries.models import SummarySegment
from summaries.signals import boundary_moved
from tests.memory.helpers import put_block
from tests.summaries.helpers import context, history

pytestmark = pytest.mark.django_db


def test_b2a_renders_blocks_in_fixed_order_with_provenance(owner, conversation):
    for label, value in (("zeta", "z"), ("profile", "Berlin"), ("persona", "Alice"), ("preferences", "tea")):
        put_block(owner, label, value)
    body = context(owner, conversation)
    items = body["blocks"]["B2a"]["items"]
    assert [(i["kind"], i["label"], i["version"]) for i in items] == [
        ("core_memory", "persona", 1),
        ("core_memory", "preferences", 1),
        ("core_memory", "profile", 1),
        ("core_memory", "zeta", 1),
    ]
    assert (
        "## Core memory\n<persona>\nAlice\n</persona>\n\n<preferences>\ntea\n</preferences>" in body["system"]
    )
    assert "memory_updates" not in body["blocks"]


def test_an_edit_mid_stretch_keeps_the_prefix_and_shows_as_a_memory_update(owner, conversation):
    put_block(owner, "preferences", "likes tea")
    history(conversation, 4)
    before = context(owner, conversation)

    put_block(owner, "preferences", "likes coffee now", version=1)
    put_block(owner, "persona", "Alice, release manager")  # a new block arrives as an update too
    after = context(owner, conversation)

    assert after["prefix"]["hashes"]["B1+B2a"] == before["prefix"]["hashes"]["B1+B2a"]
    assert after["prefix"]["hashes"]["B1+B2a+B4+B6"] == before["prefix"]["hashes"]["B1+B2a+B4+B6"]
    assert after["system"] == before["system"]
    assert "likes coffee" not in after["system"]
    updates = after["blocks"]["memory_updates"]["items"]
    assert [(u["label"], u["version"]) for u in updates] == [("persona", 1), ("preferences", 2)]
    user_text = after["messages"][-1]["content"]
    assert "## Memory updates" in user_text and "likes coffee now" in user_text


def test_after_a_compaction_boundary_the_edit_is_in_b2a(
    owner, conversation, django_capture_on_commit_callbacks
):
    put_block(owner, "preferences", "likes tea")
    history(conversation, 30)
    before = context(owner, conversation)
    put_block(owner, "preferences", "likes coffee now", version=1)

    with django_capture_on_commit_callbacks(execute=True):
        response = owner.client.post(f"/api/v1/conversations/{conversation.id}/compact", {}, format="json")
    assert response.status_code == 200, response.content
    assert SummarySegment.objects.filter(conversation=conversation).exists()
    snapshot = CoreMemorySnapshot.objects.get(conversation=conversation)
    assert snapshot.versions == {"preferences": 2}  # advanced by the boundary_moved receiver

    after = context(owner, conversation)
    assert after["prefix"]["hashes"]["B1+B2a"] != before["prefix"]["hashes"]["B1+B2a"]
    assert "likes coffee now" in after["system"]
    assert "memory_updates" not in after["blocks"]
    assert [i["version"] for i in after["blocks"]["B2a"]["items"]] == [2]


def test_a_missed_signal_is_caught_up_by_the_loader(owner, conversation):
    put_block(owner, "persona", "v1")
    history(conversation, 30)
    context(owner, conversation)
    put_block(owner, "persona", "v2", version=1)
    boundary_moved.disconnect(dispatch_uid="context.fold_core_memory")
    try:
        assert (
            owner.client.post(
                f"/api/v1/conversations/{conversation.id}/compact", {}, format="json"
            ).status_code
            == 200
        )
    finally:
        boundary_moved.connect(fold_core_memory, dispatch_uid="context.fold_core_memory")
    body = context(owner, conversation)
    assert "<persona>\nv2\n</persona>" in body["system"]


def test_a_conversation_without_an_end_user_has_no_b2a(owner):
    from conversations.services import conversation_create

    anonymous_conversation = conversation_create(tenant=owner.tenant, title="no user")
    body = context(owner, anonymous_conversation)
    assert "B2a" not in body["blocks"]


def test_versions_still_current_are_read_from_the_blocks_only_older_ones_from_their_history(
    owner, conversation, django_assert_num_queries
):
    from memory.models import CoreMemoryBlock
    from memory.selectors import core_memory_at, core_memory_blocks_current

    put_block(owner, "preferences", "likes tea")
    put_block(owner, "persona", "Alice")
    put_block(owner, "preferences", "likes coffee now", version=1)
    end_user_id = CoreMemoryBlock.objects.get(label="persona").end_user_id
    current = core_memory_blocks_current(end_user_id=end_user_id)

    def at(**versions):
        return core_memory_at(end_user_id=end_user_id, versions=versions, current=current)

    with django_assert_num_queries(0):
        assert at(persona=1, preferences=2) == {"persona": "Alice", "preferences": "likes coffee now"}
    with django_assert_num_queries(1):
        assert at(persona=1, preferences=1) == {"persona": "Alice", "preferences": "likes tea"}
    assert at(persona=1, zeta=1) == {"persona": "Alice"}
