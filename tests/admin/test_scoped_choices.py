"""a scoped user's filters and dropdowns name only its tenants (and their objects): the "By
tenant" filter listed every tenant's slug to a support user of one tenant."""

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db

LISTS = [
    "admin:conversations_conversation_changelist",
    "admin:tenants_enduser_changelist",
    "admin:tenants_apikey_changelist",
    "admin:context_agentprofile_changelist",
    "admin:prefix_cache_cacheusage_changelist",
    "admin:prefix_cache_prefixhint_changelist",
]


@pytest.mark.parametrize("name", LISTS)
def test_a_support_user_sees_only_its_tenant_in_the_lists_filters(
    client, support, conversation, outsider_conversation, name
):
    client.force_login(support.user)
    page = client.get(reverse(name))
    assert page.status_code == 200
    text = page.content.decode().lower()
    assert "outsider" not in text
    choices = [
        choice["display"]
        for spec in page.context["cl"].filter_specs
        if getattr(spec, "lookup_choices", None) is not None
        for choice in spec.choices(page.context["cl"])
    ]
    assert "Outsider" not in choices


def test_a_superuser_still_filters_by_every_tenant(client, admin_user, owner, outsider):
    client.force_login(admin_user)
    text = client.get(reverse("admin:tenants_apikey_changelist")).content.decode()
    assert f"?tenant__id__exact={outsider.tenant.pk}" in text


def test_add_form_dropdowns_offer_only_the_users_tenants(client, member, outsider):
    client.force_login(member.user)
    for name in ("admin:context_agentprofile_add", "admin:tenants_apikey_add"):
        page = client.get(reverse(name))
        assert page.status_code == 200, name
        assert "outsider" not in page.content.decode().lower(), name


def test_the_inspectors_conversation_picker_lists_only_the_users_conversations(
    client, support, conversation, outsider_conversation
):
    client.force_login(support.user)
    page = client.get(reverse("admin:context_inspector"))
    assert page.status_code == 200
    assert list(page.context["form"].fields["conversation"].queryset) == [conversation]
    assert "outsider" not in page.content.decode().lower()


def test_the_tenant_autocomplete_answers_only_the_users_tenants(client, member, outsider):
    client.force_login(member.user)
    response = client.get(
        reverse("admin:autocomplete"),
        {"app_label": "context", "model_name": "agentprofile", "field_name": "tenant", "term": ""},
    )
    assert response.status_code == 200, response.content[:300]
    assert [row["text"] for row in response.json()["results"]] == [str(member.tenant)]
