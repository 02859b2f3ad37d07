"""every tenant-owned list says whose each row is (a tenant column and filter), messages filter
by conversation, and conversations are told apart (end user, short id, created, message count) in the list
and in the inspector's picker, grouped by tenant for a superuser."""

import pytest
from django.contrib import admin
from django.urls import reverse

from conversations.services import message_append_batch
from memory.services import core_memory_write
from tenants.admin_scoping import TenantScopedAdmin
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser_client(client):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


def _tenant_owned():
    return [
        (model, model_admin)
        for model, model_admin in admin.site._registry.items()
        if isinstance(model_admin, TenantScopedAdmin) and model_admin.tenant_lookup
    ]


@pytest.mark.parametrize(("model", "model_admin"), _tenant_owned(), ids=lambda v: getattr(v, "__name__", ""))
def test_every_tenant_owned_list_has_a_tenant_column_and_filter(
    superuser_client, model, model_admin, conversation, outsider_conversation
):
    # Two tenants, so Django shows the filter (it hides one with a single choice).
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    page = superuser_client.get(url)
    assert page.status_code == 200
    request = page.wsgi_request
    names = {"tenant", "tenant_column", model_admin.tenant_lookup}
    assert names & set(model_admin.get_list_display(request))
    filters = [f[0] if isinstance(f, tuple) else f for f in model_admin.get_list_filter(request)]
    assert names & set(filters), filters
    assert [s for s in page.context["cl"].filter_specs if getattr(s, "title", "") == "tenant"]


def test_the_message_and_memory_lists_render_the_tenant(superuser_client, owner, conversation):
    message_append_batch(conversation=conversation, items=[{"role": "user", "content": "hello"}])
    core_memory_write(end_user=conversation.end_user, label="persona", value="kind")
    for name in ("conversations_message", "memory_corememoryblock"):
        html = superuser_client.get(reverse(f"admin:{name}_changelist")).content.decode()
        assert (
            "column-" in html and "tenant" in html.lower().split('id="result_list"')[1].split("</thead>")[0]
        )
        assert ">Owner<" in html or ">owner<" in html


def test_messages_filter_by_conversation_and_name_it(superuser_client, conversation, outsider_conversation):
    for target in (conversation, outsider_conversation):
        message_append_batch(conversation=target, items=[{"role": "user", "content": f"hi {target.pk}"}])
    url = reverse("admin:conversations_message_changelist")
    page = superuser_client.get(url, {"conversation__id__exact": str(conversation.pk)})
    assert [m.conversation_id for m in page.context["cl"].result_list] == [conversation.pk]
    [spec] = [s for s in page.context["cl"].filter_specs if s.title == "conversation"]
    labels = [label for _value, label in spec.lookup_choices]
    assert any(label.startswith(f"alice · {str(conversation.pk)[:8]} · ") for label in labels), labels
    assert superuser_client.get(url, {"conversation__id__exact": "nope"}).status_code == 200


def test_conversations_are_told_apart_in_the_list(superuser_client, conversation):
    message_append_batch(conversation=conversation, items=[{"role": "user", "content": "one"}])
    page = superuser_client.get(reverse("admin:conversations_conversation_changelist"))
    html = page.content.decode()
    assert str(conversation.pk)[:8] in html
    assert "alice" in html
    assert "column-message_count" in html


def test_the_inspector_picker_groups_conversations_by_tenant_for_a_superuser(
    superuser_client, conversation, outsider_conversation
):
    page = superuser_client.get(reverse("admin:context_inspector"))
    html = page.content.decode()
    assert '<optgroup label="Owner">' in html and '<optgroup label="Outsider">' in html
    assert f"alice · {str(conversation.pk)[:8]} · " in html


def test_the_inspector_picker_of_a_one_tenant_user_is_flat_and_labelled(client, member, conversation):
    client.force_login(member.user)
    html = client.get(reverse("admin:context_inspector")).content.decode()
    assert "<optgroup" not in html
    assert f"alice · {str(conversation.pk)[:8]} · " in html
