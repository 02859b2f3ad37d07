"""access_conversation reads a conversation and its end user with one fixed statement (ScopedRowLookup):
it must give what the ORM gives, field by field, and refuse what the ORM lookup refused."""

import uuid
from datetime import datetime

import pytest
from django.http import Http404
from django.utils import timezone

from conversations.models import Conversation
from conversations.selectors import access_conversation
from tests.factories import ConversationFactory, EndUserFactory, TenantFactory

pytestmark = pytest.mark.django_db


def _fields(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def test_it_gives_every_field_as_the_orm_does_with_the_end_user_loaded(django_assert_num_queries):
    tenant = TenantFactory()
    end_user = EndUserFactory(tenant=tenant, external_id="ext-42")
    stored = ConversationFactory(
        tenant=tenant,
        end_user=end_user,
        title="Éé 中文",
        metadata={"nested": {"list": [1, 2.5, None, True]}, "text": "ok"},
        archived_at=timezone.now(),
        last_seq=7,
    )
    expected = Conversation.objects.select_related("end_user").get(pk=stored.pk)

    with django_assert_num_queries(1):
        got = access_conversation(tenant=tenant, conversation_id=str(stored.pk))
        assert got.end_user.external_id == "ext-42"  # loaded with it: no second query

    assert _fields(got) == _fields(expected)
    assert _fields(got.end_user) == _fields(expected.end_user)
    assert isinstance(got.id, uuid.UUID)
    assert isinstance(got.created_at, datetime) and got.created_at.tzinfo is not None
    assert got.metadata["nested"]["list"] == [1, 2.5, None, True]
    assert got.tenant is tenant
    assert got._state.adding is False and got._state.db == "default"


def test_a_conversation_without_an_end_user_has_none_loaded(django_assert_num_queries):
    tenant = TenantFactory()
    stored = ConversationFactory(tenant=tenant)
    with django_assert_num_queries(1):
        got = access_conversation(tenant=tenant, conversation_id=stored.pk)
        assert got.end_user is None
    assert _fields(got) == _fields(Conversation.objects.get(pk=stored.pk))


def test_a_fetched_conversation_saves_like_an_orm_one():
    tenant = TenantFactory()
    stored = ConversationFactory(tenant=tenant, title="before")
    got = access_conversation(tenant=tenant, conversation_id=stored.pk)
    got.title = "after"
    got.save(update_fields=["title"])
    assert Conversation.objects.get(pk=stored.pk).title == "after"
    assert Conversation.objects.count() == 1


@pytest.mark.parametrize("conversation_id", ["not-a-uuid", "", "5f0c4a1e-8d3b-4c2a-9e7f-1b2d3c4e5f60", 12])
def test_malformed_or_unknown_ids_are_404(conversation_id):
    tenant = TenantFactory()
    ConversationFactory(tenant=tenant)
    with pytest.raises(Http404):
        access_conversation(tenant=tenant, conversation_id=conversation_id)


def test_another_tenants_conversation_is_404():
    stored = ConversationFactory(end_user=EndUserFactory())
    with pytest.raises(Http404):
        access_conversation(tenant=TenantFactory(), conversation_id=stored.pk)
