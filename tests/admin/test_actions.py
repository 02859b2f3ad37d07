"""every admin action checks the role it needs, and is not offered to a role that may not run
it. Revoking keys is for operators; support may keep reverting memory operations (their job)."""

import pytest
from django.contrib import admin
from django.urls import reverse

from conversations.models import Conversation
from memory.models import MemoryOperation
from memory.services import core_memory_write
from tenants.admin_scoping import TenantScopedAdmin
from tenants.models import ApiKey
from tenants.services import end_user_get_or_create
from tests.admin.conftest import action_names

pytestmark = pytest.mark.django_db

KEYS = reverse("admin:tenants_apikey_changelist")


def revoke(client, *keys):
    return client.post(
        KEYS, {"action": "revoke", "_selected_action": [k.pk for k in keys], "index": 0}, follow=True
    )


def test_support_is_not_offered_revoke_and_cannot_run_it(client, owner, support):
    client.force_login(support.user)
    assert "revoke" not in action_names(client.get(KEYS))
    revoke(client, owner.api_key)
    assert ApiKey.objects.get(pk=owner.api_key.pk).revoked_at is None
    assert owner.client.get("/api/v1/conversations").status_code == 200


def test_an_operator_revokes_its_tenants_key(client, owner, member):
    client.force_login(member.user)
    assert "revoke" in action_names(client.get(KEYS))
    revoke(client, owner.api_key)
    assert ApiKey.objects.get(pk=owner.api_key.pk).revoked_at is not None


def test_an_operator_does_not_revoke_a_key_of_a_tenant_it_only_supports(
    client, owner, outsider, operator_and_support
):
    client.force_login(operator_and_support.user)
    page = revoke(client, owner.api_key, outsider.api_key)
    assert "Revoked 1 key(s)." in [str(m) for m in page.context["messages"]]
    assert ApiKey.objects.get(pk=owner.api_key.pk).revoked_at is not None
    assert ApiKey.objects.get(pk=outsider.api_key.pk).revoked_at is None


def test_compaction_actions_skip_conversations_of_a_tenant_the_user_only_supports(
    client, owner, outsider, operator_and_support, conversation, outsider_conversation, monkeypatch
):
    requested = []
    monkeypatch.setattr(
        "summaries.admin.compaction_run",
        lambda *, conversation, trigger, sync: requested.append(conversation.pk),
    )
    client.force_login(operator_and_support.user)
    url = reverse("admin:conversations_conversation_changelist")
    selected = [conversation.pk, outsider_conversation.pk]
    client.post(url, {"action": "compact_now", "_selected_action": selected, "index": 0})
    assert requested == [conversation.pk]


def test_support_is_offered_no_conversation_action(client, support, conversation):
    client.force_login(support.user)
    page = client.get(reverse("admin:conversations_conversation_changelist"))
    assert action_names(page) == set()
    assert Conversation.objects.filter(pk=conversation.pk).exists()


def test_support_still_reverts_memory_operations(client, owner, support):
    end_user = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    core_memory_write(end_user=end_user, label="preferences", value="likes tea")
    core_memory_write(end_user=end_user, label="preferences", value="likes coffee", expected_version=1)
    client.force_login(support.user)
    url = reverse("admin:memory_memoryoperation_changelist")
    assert "revert" in action_names(client.get(url))
    latest = MemoryOperation.objects.filter(end_user=end_user).latest("created_at")
    client.post(url, {"action": "revert", "_selected_action": [latest.pk], "index": 0})
    assert end_user.memory_blocks.get(label="preferences").value == "likes tea"


def test_every_action_of_a_tenant_admin_declares_the_permission_it_needs():
    """An action without `permissions` is offered to (and runs for) anyone who may view the list."""
    unchecked = [
        f"{model.__name__}.{name}"
        for model, model_admin in admin.site._registry.items()
        if isinstance(model_admin, TenantScopedAdmin) or model.__module__.startswith("axes.")
        for func, name, _description in model_admin._get_base_actions()
        if not getattr(func, "allowed_permissions", None)
    ]
    assert unchecked == []
