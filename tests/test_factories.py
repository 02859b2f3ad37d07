"""The factories cannot build a row whose tenant differs from the rows it belongs to."""

import pytest

from tests.factories import ArchivedImageFactory, ConversationFactory, EndUserFactory, TenantFactory

pytestmark = pytest.mark.django_db


def test_a_conversation_takes_its_end_users_tenant():
    end_user = EndUserFactory()
    assert ConversationFactory(end_user=end_user).tenant == end_user.tenant


def test_a_conversation_of_another_tenants_end_user_cannot_be_built():
    with pytest.raises(ValueError, match="another tenant"):
        ConversationFactory(end_user=EndUserFactory(), tenant=TenantFactory())


def test_an_image_takes_its_conversations_tenant_and_id():
    conversation = ConversationFactory()
    image = ArchivedImageFactory(conversation=conversation)
    assert (image.tenant, image.conversation_id) == (conversation.tenant, conversation.pk)
