"""Which token budget a context call works to: the request's, else the tenant's setting, else a default the
model can use (its reply included)."""

import pytest

from conversations.services import conversation_create
from tests.context.helpers import context, exchanges

pytestmark = pytest.mark.django_db


def test_the_budget_comes_from_the_tenant_settings_or_the_default(owner, conversation):
    assert context(owner, conversation, user_message="hi")["token_budget"] == 32000
    owner.tenant.settings = {"token_budget": 5000}
    owner.tenant.save()
    conversation.refresh_from_db()
    assert context(owner, conversation, user_message="hi")["token_budget"] == 5000
    assert context(owner, conversation, user_message="hi", token_budget=900)["token_budget"] == 900


def test_the_default_budget_of_a_model_whose_reply_may_fill_the_window_is_usable(owner):
    conversation = conversation_create(tenant=owner.tenant, model="gpt-4")
    exchanges(conversation, 2)
    body = context(owner, conversation, user_message="hi")
    assert 256 <= body["token_budget"] <= 8192
    assert body["degradations"] == []
