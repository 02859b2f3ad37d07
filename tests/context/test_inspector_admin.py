"""The context inspector and the cache dashboard in the admin: tenant-scoped, and the inspector records
nothing."""

import pytest
from django.urls import reverse

from context.models import ConversationContext
from conversations.services import message_append_batch
from prefix_cache.models import CacheUsage, PrefixHint
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(conversation):
    message_append_batch(
        conversation=conversation,
        items=[
            {"role": "user", "content": "Deploy to staging at 5pm, the config lives in /etc/app/prod.yaml."},
            {"role": "assistant", "content": "Done: staging runs build 4121."},
        ],
    )
    return conversation


def test_inspector_shows_blocks_and_records_nothing(client, member, history):
    client.force_login(member.user)
    url = reverse("admin:context_inspector")
    assert client.get(url).status_code == 200
    response = client.post(
        url,
        {
            "conversation": history.pk,
            "user_message": "Which build?",
            "format": "anthropic",
            "token_budget": 4000,
        },
    )
    assert response.status_code == 200
    result = response.context["result"]
    assert result["format"] == "anthropic"
    assert [item["seq"] for item in result["blocks"]["B6"]["items"]] == [1, 2]
    assert b"build 4121" in response.content
    assert not PrefixHint.objects.exists()
    assert not CacheUsage.objects.exists()
    assert not ConversationContext.objects.exists()  # the dry run was rolled back


def test_inspector_offers_only_the_members_conversations(client, member, history, outsider_conversation):
    client.force_login(member.user)
    url = reverse("admin:context_inspector")
    form = client.get(url).context["form"]
    assert list(form.fields["conversation"].queryset) == [history]
    response = client.post(
        url, {"conversation": outsider_conversation.pk, "user_message": "x", "format": "openai"}
    )
    assert response.context["result"] is None
    assert "conversation" in response.context["form"].errors


def test_inspector_and_dashboard_need_a_membership(client, history):
    client.force_login(UserFactory())
    assert client.get(reverse("admin:context_inspector")).status_code == 403
    assert client.get(reverse("admin:prefix_cache_dashboard")).status_code == 403


def test_dashboard_shows_reported_usage_of_the_members_tenant(
    client, owner, outsider, history, outsider_conversation
):
    owner.client.post(f"/api/v1/conversations/{history.id}/context", {"user_message": "hi"}, format="json")
    owner.client.post(
        f"/api/v1/conversations/{history.id}/usage",
        {"usage": {"prompt_tokens": 2048, "prompt_tokens_details": {"cached_tokens": 1024}}},
        format="json",
    )
    outsider.client.post(
        f"/api/v1/conversations/{outsider_conversation.id}/usage",
        {"usage": {"prompt_tokens": 999, "prompt_tokens_details": {"cached_tokens": 0}}},
        format="json",
    )
    support = MembershipFactory(tenant=owner.tenant, role="support")
    client.force_login(support.user)
    response = client.get(reverse("admin:prefix_cache_dashboard"))
    assert response.status_code == 200
    assert [t.slug for t in response.context["tenants"]] == ["owner"]
    (day,) = response.context["days"]
    assert (day["prompt_tokens"], day["cached_tokens"], day["hit_pct"]) == (2048, 1024, 50.0)
    # Asking for another tenant by slug falls back to the member's own.
    response = client.get(reverse("admin:prefix_cache_dashboard"), {"tenant": "outsider"})
    assert response.context["tenant"] == owner.tenant
