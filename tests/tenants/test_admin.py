"""Admin scoping: members see and edit only their tenant's objects, with what their role allows."""

import pytest
from django.urls import reverse

from conversations.models import Message
from providers.tokens import count_message
from tenants.models import ApiKey, Membership, hash_api_key
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


def login(client, user):
    client.force_login(user)
    return client


def test_operator_sees_only_its_tenant(client, member, conversation, outsider_conversation):
    login(client, member.user)
    page = client.get(reverse("admin:conversations_conversation_changelist"))
    assert page.status_code == 200
    assert list(page.context["cl"].result_list) == [conversation]
    foreign = client.get(reverse("admin:conversations_conversation_change", args=[outsider_conversation.pk]))
    # Django's admin answers an object outside the queryset with a redirect to the index, never the object.
    assert foreign.status_code == 302
    assert client.get(reverse("admin:tenants_tenant_changelist")).content.count(b"/change/") == 1


def test_operator_edits_its_conversation_but_not_another_tenants(
    client, member, conversation, outsider_conversation
):
    login(client, member.user)
    url = reverse("admin:conversations_conversation_change", args=[conversation.pk])
    response = client.post(
        url,
        {
            "title": "Fixed by operator",
            "model": "gpt-4o",
            "metadata": "{}",
            "turns-TOTAL_FORMS": 0,
            "turns-INITIAL_FORMS": 0,
        },
    )
    assert response.status_code == 302
    conversation.refresh_from_db()
    assert conversation.title == "Fixed by operator"
    url = reverse("admin:conversations_conversation_change", args=[outsider_conversation.pk])
    client.post(url, {"title": "pwned", "model": "gpt-4o", "metadata": "{}"})
    outsider_conversation.refresh_from_db()
    assert outsider_conversation.title == "Outsider's"


def test_support_views_but_cannot_change(client, owner, conversation):
    support = MembershipFactory(tenant=owner.tenant, role=Membership.Role.SUPPORT)
    login(client, support.user)
    url = reverse("admin:conversations_conversation_change", args=[conversation.pk])
    assert client.get(url).status_code == 200
    response = client.post(url, {"title": "support edit", "model": "gpt-4o", "metadata": "{}"})
    assert response.status_code == 403
    conversation.refresh_from_db()
    assert conversation.title == "Owner's conversation"


def test_staff_without_membership_sees_nothing(client, conversation):
    login(client, UserFactory())
    assert client.get(reverse("admin:conversations_conversation_changelist")).status_code == 403
    assert client.get(reverse("admin:tenants_membership_changelist")).status_code == 403


def test_memberships_are_for_superusers(client, member, conversation, outsider_conversation, admin_user):
    login(client, member.user)
    assert client.get(reverse("admin:tenants_membership_changelist")).status_code == 403
    login(client, admin_user)
    page = client.get(reverse("admin:conversations_conversation_changelist"))
    assert set(page.context["cl"].result_list) == {conversation, outsider_conversation}


def test_operator_creates_an_api_key_shown_once(client, member):
    login(client, member.user)
    response = client.post(
        reverse("admin:tenants_apikey_add"), {"tenant": member.tenant.pk, "name": "ci"}, follow=True
    )
    assert response.status_code == 200
    shown = next(str(m) for m in response.context["messages"] if "shown once" in str(m))
    raw_key = shown.rsplit(" ", 1)[1]
    key = ApiKey.objects.get(tenant=member.tenant, name="ci")
    assert key.hashed_key == hash_api_key(raw_key)
    assert raw_key not in client.get(reverse("admin:tenants_apikey_change", args=[key.pk])).content.decode()


def test_operator_cannot_create_a_key_for_another_tenant(client, member, outsider):
    login(client, member.user)
    response = client.post(
        reverse("admin:tenants_apikey_add"), {"tenant": outsider.tenant.pk, "name": "evil"}
    )
    assert response.status_code == 200  # the form comes back with an error
    assert not ApiKey.objects.filter(name="evil").exists()


def test_operator_correction_of_a_message_recounts_tokens(client, member, conversation):
    message = Message.objects.create(
        conversation=conversation, seq=1, role="user", content="hi", token_count=99
    )
    login(client, member.user)
    url = reverse("admin:conversations_message_change", args=[message.pk])
    response = client.post(
        url, {"content": "Hello, corrected", "parts": "[]", "completed": "on", "metadata": "{}"}
    )
    assert response.status_code == 302
    message.refresh_from_db()
    assert message.content == "Hello, corrected"
    assert message.token_count == count_message(role="user", content="Hello, corrected", model="gpt-4o")
    response = client.post(url, {"content": "x", "parts": '[{"type": "bogus"}]', "metadata": "{}"})
    assert response.status_code == 200
    assert b"Unknown part type" in response.content
