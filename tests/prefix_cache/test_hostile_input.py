"""Token counts beyond what the usage columns hold (PositiveIntegerField): a 400 with a field error naming
the count, never a 500, and nothing recorded; an outsider gets a 404."""

import pytest

from prefix_cache.models import CacheUsage
from tenants.validation import INT32_MAX

pytestmark = pytest.mark.django_db


def usage_url(conversation) -> str:
    return f"/api/v1/conversations/{conversation.id}/usage"


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        ({"prompt_tokens": 10**30}, ["prompt_tokens"]),
        ({"prompt_tokens": 10, "completion_tokens": INT32_MAX + 1}, ["completion_tokens"]),
        (
            {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 10**30}},
            ["prompt_tokens_details", "cached_tokens"],
        ),
        ({"input_tokens": INT32_MAX, "cache_read_input_tokens": INT32_MAX}, ["input_tokens"]),
        ({"promptTokenCount": 10**30}, ["promptTokenCount"]),
    ],
    ids=["openai", "completion", "openai-cached", "anthropic-sum", "gemini"],
)
def test_a_token_count_beyond_the_column_is_a_field_error(owner, conversation, usage, field):
    response = owner.client.post(usage_url(conversation), {"usage": usage}, format="json")
    assert response.status_code == 400
    body = response.json()["error"]
    assert body["code"] == "max_value"
    fields = body["extra"]["fields"]["usage"]
    for key in field:
        fields = fields[key]
    assert fields[0]["code"] == "max_value"
    assert not CacheUsage.objects.exists()


def test_an_outsider_reporting_a_huge_count_gets_404(outsider, conversation):
    response = outsider.client.post(
        usage_url(conversation), {"usage": {"prompt_tokens": 10**30}}, format="json"
    )
    assert response.status_code == 404
