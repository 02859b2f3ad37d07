"""Admin: support staff and operators of the tenant edit core memory through the versioned service (a stale
form is refused, never an overwrite), every change is logged, operations can be reverted, and nobody sees
another tenant's memory."""

import pytest
from django.urls import reverse

from memory.models import Actor, CoreMemoryBlock, MemoryOperation
from memory.services import core_memory_write
from tenants.models import Membership
from tenants.services import end_user_get_or_create
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def support(owner) -> Membership:
    return MembershipFactory(tenant=owner.tenant, role=Membership.Role.SUPPORT)


@pytest.fixture
def block(owner) -> CoreMemoryBlock:
    end_user = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    return core_memory_write(end_user=end_user, label="preferences", value="likes tea")[0]


def change_url(block: CoreMemoryBlock) -> str:
    return reverse("admin:memory_corememoryblock_change", args=[block.pk])


def form(block: CoreMemoryBlock, value: str, *, version: int, reason: str = "support ticket 42") -> dict:
    return {"value": value, "char_limit": block.char_limit, "expected_version": version, "reason": reason}


@pytest.mark.parametrize("role", [Membership.Role.SUPPORT, Membership.Role.OPERATOR])
def test_support_and_operators_edit_a_block_and_it_is_logged(client, owner, block, role):
    membership = MembershipFactory(tenant=owner.tenant, role=role)
    client.force_login(membership.user)
    page = client.get(change_url(block))
    assert page.status_code == 200
    assert "likes tea" in page.content.decode()
    response = client.post(change_url(block), form(block, "likes coffee", version=1))
    assert response.status_code == 302, response.content.decode()[:2000]
    block.refresh_from_db()
    assert (block.value, block.version) == ("likes coffee", 2)
    op = MemoryOperation.objects.get(op=MemoryOperation.Op.CORE_UPDATE)
    assert (op.old_value, op.new_value, op.actor, op.actor_name, op.trigger) == (
        "likes tea",
        "likes coffee",
        Actor.ADMIN,
        membership.user.username,
        "support ticket 42",
    )


def test_a_stale_form_is_refused_not_overwritten(client, support, block):
    client.force_login(support.user)
    core_memory_write(end_user=block.end_user, label="preferences", value="likes water", expected_version=1)
    response = client.post(change_url(block), form(block, "likes coffee", version=1))
    assert response.status_code == 200  # the form again, with the error
    assert "Someone changed this block" in response.content.decode()
    block.refresh_from_db()
    assert (block.value, block.version) == ("likes water", 2)


def test_over_the_limit_is_a_form_error(client, support, block):
    client.force_login(support.user)
    response = client.post(change_url(block), {**form(block, "x" * 50, version=1), "char_limit": 10})
    assert response.status_code == 200
    assert "over the block" in response.content.decode()
    block.refresh_from_db()
    assert block.version == 1


def test_revert_action_restores_the_old_value_as_a_new_operation(client, support, block):
    core_memory_write(end_user=block.end_user, label="preferences", value="likes coffee", expected_version=1)
    update = MemoryOperation.objects.get(op=MemoryOperation.Op.CORE_UPDATE)
    client.force_login(support.user)
    response = client.post(
        reverse("admin:memory_memoryoperation_changelist"),
        {"action": "revert", "_selected_action": [str(update.pk)]},
    )
    assert response.status_code == 302
    block.refresh_from_db()
    assert (block.value, block.version) == ("likes tea", 3)
    update.refresh_from_db()
    revert = MemoryOperation.objects.get(op=MemoryOperation.Op.CORE_REVERT)
    assert update.reverted_by == revert
    assert (revert.old_value, revert.new_value, revert.actor) == ("likes coffee", "likes tea", Actor.ADMIN)


def test_revert_refuses_when_the_block_changed_since(client, support, block):
    core_memory_write(end_user=block.end_user, label="preferences", value="likes coffee", expected_version=1)
    update = MemoryOperation.objects.get(op=MemoryOperation.Op.CORE_UPDATE)
    core_memory_write(end_user=block.end_user, label="preferences", value="likes juice", expected_version=2)
    client.force_login(support.user)
    client.post(
        reverse("admin:memory_memoryoperation_changelist"),
        {"action": "revert", "_selected_action": [str(update.pk)]},
    )
    block.refresh_from_db()
    assert block.value == "likes juice"


def test_outsiders_see_no_memory(client, outsider, block):
    stranger = MembershipFactory(tenant=outsider.tenant, role=Membership.Role.SUPPORT)
    client.force_login(stranger.user)
    assert client.get(change_url(block)).status_code == 302  # "does not exist", back to the index
    listing = client.get(reverse("admin:memory_corememoryblock_changelist"))
    assert "likes tea" not in listing.content.decode()
    ops = client.get(reverse("admin:memory_memoryoperation_changelist"))
    assert "preferences" not in ops.content.decode()
    op = MemoryOperation.objects.get()
    client.post(
        reverse("admin:memory_memoryoperation_changelist"),
        {"action": "revert", "_selected_action": [str(op.pk)]},
    )
    assert MemoryOperation.objects.count() == 1


def test_support_corrects_an_archival_memory_and_a_stale_form_is_refused(client, support, owner, settings):
    from memory.archival import archival_insert

    settings.MNEMO_EMBEDDINGS = "none"
    end_user = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    memory = archival_insert(end_user=end_user, content="Alice lives in Berlin.").memory
    url = reverse("admin:memory_archivalmemory_change", args=[memory.pk])
    client.force_login(support.user)
    page = client.get(url)
    assert page.status_code == 200
    stamp = memory.updated_at.isoformat()
    body = {"content": "Alice lives in Hamburg.", "kind": "fact", "importance": 0.5, "reason": "ticket 7"}
    response = client.post(url, {**body, "expected_updated_at": stamp})
    assert response.status_code == 302, response.content.decode()[:3000]
    memory.refresh_from_db()
    assert memory.content == "Alice lives in Hamburg."
    op = MemoryOperation.objects.get(op=MemoryOperation.Op.ARCHIVAL_UPDATE)
    assert (op.old_value, op.new_value, op.actor, op.trigger) == (
        "Alice lives in Berlin.",
        "Alice lives in Hamburg.",
        "admin",
        "ticket 7",
    )
    stale = client.post(url, {**body, "content": "Alice lives in Munich.", "expected_updated_at": stamp})
    assert stale.status_code == 200
    assert "Someone changed this memory" in stale.content.decode()
    memory.refresh_from_db()
    assert memory.content == "Alice lives in Hamburg."


def test_reverting_an_invalidation_brings_the_older_fact_back(client, support, owner, settings):
    from memory.archival import archival_insert

    settings.MNEMO_EMBEDDINGS = "none"
    end_user = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    old = archival_insert(end_user=end_user, content="My favourite colour is green.").memory
    archival_insert(end_user=end_user, content="My favourite colour is blue.")
    invalidation = MemoryOperation.objects.get(op=MemoryOperation.Op.ARCHIVAL_INVALIDATE)
    client.force_login(support.user)
    client.post(
        reverse("admin:memory_memoryoperation_changelist"),
        {"action": "revert", "_selected_action": [str(invalidation.pk)]},
    )
    old.refresh_from_db()
    assert old.invalidated_at is None
    invalidation.refresh_from_db()
    assert invalidation.reverted_by.op == MemoryOperation.Op.ARCHIVAL_REVERT
