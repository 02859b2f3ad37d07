"""audit and derived rows are append-only in the admin, for superusers too: no add page and no
delete (the services that record them are the only writers); a message's content may still be corrected,
and deleting a conversation still takes its messages with it."""

import pytest
from django.urls import reverse

from conversations.models import Conversation, Message
from tests.admin.conftest import action_names

pytestmark = pytest.mark.django_db

APPEND_ONLY = [
    "memory_memoryoperation",
    "prefix_cache_cacheusage",
    "prefix_cache_prefixhint",
    "summaries_summarysegment",
    "tenants_llmusage",
    "conversations_message",
    "cold_storage_archivedimage",
]


@pytest.mark.parametrize("name", APPEND_ONLY)
def test_no_one_adds_or_deletes_audit_rows(client, admin_user, name):
    client.force_login(admin_user)
    assert client.get(reverse(f"admin:{name}_add")).status_code == 403
    page = client.get(reverse(f"admin:{name}_changelist"))
    assert page.status_code == 200
    assert "delete_selected" not in action_names(page)


def test_a_message_is_corrected_but_not_deleted(client, admin_user, conversation):
    message = Message.objects.create(conversation=conversation, seq=1, role="user", content="hi")
    client.force_login(admin_user)
    assert client.get(reverse("admin:conversations_message_delete", args=[message.pk])).status_code == 403
    response = client.post(
        reverse("admin:conversations_message_change", args=[message.pk]),
        {"content": "hello", "parts": "[]", "completed": "on", "metadata": "{}"},
    )
    assert response.status_code == 302
    message.refresh_from_db()
    assert message.content == "hello"


def test_an_operator_deletes_a_conversation_with_its_messages(client, member, conversation):
    Message.objects.create(conversation=conversation, seq=1, role="user", content="hi")
    client.force_login(member.user)
    url = reverse("admin:conversations_conversation_delete", args=[conversation.pk])
    assert client.get(url).status_code == 200
    assert client.post(url, {"post": "yes"}).status_code == 302
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Message.objects.filter(conversation_id=conversation.pk).exists()
