"""Hostile input to the context call and agent profiles: a user message larger than a stored message may
be, a token budget beyond what a column holds, and numbers sent where a boolean belongs. Each is a 400 in the
error shape; an outsider gets a 404."""

import pytest

from context.models import AgentProfile
from context.services import agent_profile_create
from tests.context.helpers import context, context_call, error_code

pytestmark = pytest.mark.django_db

PROFILES = "/api/v1/agent-profiles"


def test_a_user_message_over_the_message_limit_is_refused(owner, conversation, settings):
    settings.MNEMO_MAX_MESSAGE_BYTES = 64 * 1024
    response = context_call(owner, conversation, user_message="é" * 40 * 1024)  # 80 KiB of UTF-8
    assert response.status_code == 400
    body = response.json()["error"]
    assert body["code"] == "message_too_large"
    assert body["message"].startswith("user_message: ")


def test_a_five_megabyte_user_message_is_refused_at_the_default_limit(owner, conversation):
    response = context_call(owner, conversation, user_message="word " * 1_000_000)
    assert response.status_code == 400
    assert error_code(response) == "message_too_large"


def test_attachments_count_with_the_user_message(owner, conversation, settings):
    settings.MNEMO_MAX_MESSAGE_BYTES = 1000
    attachments = [{"name": "a.txt", "content": "x" * 600}, {"name": "b.txt", "description": "y" * 600}]
    response = context_call(owner, conversation, user_message="hi", attachments=attachments)
    assert response.status_code == 400
    assert error_code(response) == "message_too_large"
    # Under the limit it is the usual call.
    context(owner, conversation, user_message="hi", attachments=attachments[:1])


def test_an_outsider_sending_a_huge_user_message_gets_404(outsider, conversation, settings):
    settings.MNEMO_MAX_MESSAGE_BYTES = 1000
    assert context_call(outsider, conversation, user_message="x" * 5000).status_code == 404


def test_a_token_budget_beyond_the_column_is_a_400(owner, conversation):
    response = context_call(owner, conversation, user_message="hi", token_budget=10**30)
    assert response.status_code == 400
    assert error_code(response) == "max_value"


@pytest.mark.parametrize("value", [0, 1, "true", "no"])
def test_is_default_must_be_a_json_boolean(owner, value):
    response = owner.client.post(PROFILES, {"name": "Support", "is_default": value}, format="json")
    assert response.status_code == 400
    assert error_code(response) == "invalid"
    assert not AgentProfile.objects.exists()


def test_is_default_must_be_a_json_boolean_on_change_too(owner, outsider):
    profile = agent_profile_create(tenant=owner.tenant, name="Support")
    response = owner.client.patch(f"{PROFILES}/{profile.id}", {"is_default": 1}, format="json")
    assert response.status_code == 400
    profile.refresh_from_db()
    assert profile.is_default is False
    # The outsider's change of the owner's profile is a 404 whatever it sends.
    assert (
        outsider.client.patch(f"{PROFILES}/{profile.id}", {"is_default": 1}, format="json").status_code == 404
    )


def test_retrieval_enabled_must_be_a_json_boolean(owner, conversation):
    response = context_call(owner, conversation, user_message="hi", retrieval={"enabled": 0})
    assert response.status_code == 400
    assert error_code(response) == "invalid"
