"""GET /api/v1/prefix-cache/stats: hit rate, cached tokens, prediction error and savings per model, day or
conversation, from reported usage only, inside the caller's tenant."""

from datetime import UTC, datetime

import pytest

from conversations.services import conversation_create
from prefix_cache.models import CacheUsage
from prefix_cache.pricing import savings_usd
from tests.context.helpers import context, error_code

pytestmark = pytest.mark.django_db

STATS = "/api/v1/prefix-cache/stats"
DAY1 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
DAY2 = datetime(2025, 3, 2, 12, 0, tzinfo=UTC)


def row(conversation, *, model, prompt, cached, predicted, written=None, created_at=DAY1, reported=True):
    return CacheUsage.objects.create(
        tenant=conversation.tenant,
        conversation=conversation,
        provider="anthropic" if model.startswith("claude") else "openai",
        model=model,
        prompt_tokens=prompt if reported else None,
        cached_tokens=cached if reported else None,
        cache_write_tokens=written,
        predicted_prompt_tokens=prompt,
        predicted_cacheable_tokens=predicted,
        created_at=created_at,
        reported_at=created_at if reported else None,
    )


@pytest.fixture
def usage_rows(owner, outsider, conversation, outsider_conversation):
    other = conversation_create(tenant=owner.tenant, title="second")
    row(conversation, model="gpt-4o", prompt=2000, cached=1024, predicted=1024, created_at=DAY1)
    row(conversation, model="gpt-4o", prompt=3000, cached=2048, predicted=1536, created_at=DAY2)
    row(
        other,
        model="claude-sonnet-4",
        prompt=10_000,
        cached=8000,
        written=1000,
        predicted=9000,
        created_at=DAY2,
    )
    row(other, model="acme-local", prompt=500, cached=0, predicted=0, created_at=DAY2)
    # Not counted: a call still waiting for its usage, and the outsider's traffic.
    row(conversation, model="gpt-4o", prompt=9999, cached=0, predicted=9999, reported=False)
    row(outsider_conversation, model="gpt-4o", prompt=50_000, cached=40_000, predicted=40_000)
    return other


def stats(actor, **params):
    response = actor.client.get(STATS, params)
    assert response.status_code == 200, response.content
    return response.json()


def test_a_million_cached_gpt_4o_tokens_save_a_dollar_twenty_five():
    # gpt-4o input 2.50 USD/M, cached input 1.25 USD/M.
    assert savings_usd(model="gpt-4o", cached_tokens=1_000_000, cache_write_tokens=0) == pytest.approx(1.25)
    assert savings_usd(
        model="gpt-4o-2024-08-06", cached_tokens=1_000_000, cache_write_tokens=0
    ) == pytest.approx(1.25)
    # The longest prefix wins: gpt-4o-mini has its own price (0.15 → 0.075).
    assert savings_usd(model="gpt-4o-mini", cached_tokens=1_000_000, cache_write_tokens=0) == pytest.approx(
        0.075
    )
    # Anthropic charges a surcharge for writing the cache (3.75 vs 3.00 for Sonnet 4).
    assert savings_usd(
        model="claude-sonnet-4-20250514", cached_tokens=1_000_000, cache_write_tokens=1_000_000
    ) == pytest.approx(2.70 - 0.75)
    assert savings_usd(model="acme-local", cached_tokens=1_000_000, cache_write_tokens=0) is None


def test_group_by_model(owner, usage_rows):
    body = stats(owner, group_by="model")
    assert body["group_by"] == "model"
    assert body["results"] == [
        {
            "key": "acme-local",
            "requests": 1,
            "prompt_tokens": 500,
            "cached_tokens": 0,
            "cache_write_tokens": 0,
            "hit_rate": 0.0,
            "predicted_cacheable_tokens": 0,
            "prediction_mean_abs_error_tokens": 0.0,
            "prediction_error_rate": 0.0,
            "savings_usd": 0.0,
            "unpriced_models": ["acme-local"],
        },
        {
            "key": "claude-sonnet-4",
            "requests": 1,
            "prompt_tokens": 10_000,
            "cached_tokens": 8000,
            "cache_write_tokens": 1000,
            "hit_rate": 0.8,
            "predicted_cacheable_tokens": 9000,
            "prediction_mean_abs_error_tokens": 1000.0,
            "prediction_error_rate": 0.1,
            # 8,000 × (3.00 − 0.30) − 1,000 × (3.75 − 3.00), per million
            "savings_usd": 0.02085,
            "unpriced_models": [],
        },
        {
            "key": "gpt-4o",
            "requests": 2,
            "prompt_tokens": 5000,
            "cached_tokens": 3072,
            "cache_write_tokens": 0,
            "hit_rate": 0.6144,  # 3,072 / 5,000
            "predicted_cacheable_tokens": 2560,
            "prediction_mean_abs_error_tokens": 256.0,  # (|1,024 − 1,024| + |1,536 − 2,048|) / 2
            "prediction_error_rate": 0.1024,  # 512 / 5,000
            "savings_usd": 0.00384,  # 3,072 × (2.50 − 1.25) / 1e6
            "unpriced_models": [],
        },
    ]


def test_group_by_day(owner, usage_rows):
    results = {r["key"]: r for r in stats(owner, group_by="day")["results"]}
    assert list(results) == ["2025-03-01", "2025-03-02"]
    assert (results["2025-03-01"]["requests"], results["2025-03-01"]["cached_tokens"]) == (1, 1024)
    day2 = results["2025-03-02"]
    assert (day2["requests"], day2["prompt_tokens"], day2["cached_tokens"]) == (3, 13_500, 10_048)
    assert day2["hit_rate"] == round(10_048 / 13_500, 4)
    assert day2["savings_usd"] == pytest.approx(0.02085 + 2048 * 1.25 / 1e6)
    assert day2["unpriced_models"] == ["acme-local"]


def test_group_by_conversation(owner, conversation, usage_rows):
    results = {r["key"]: r for r in stats(owner, group_by="conversation")["results"]}
    assert set(results) == {str(conversation.id), str(usage_rows.id)}
    assert results[str(conversation.id)]["cached_tokens"] == 3072
    assert results[str(usage_rows.id)]["requests"] == 2
    assert results[str(usage_rows.id)]["prediction_mean_abs_error_tokens"] == 500.0  # (1,000 + 0) / 2


def test_model_is_the_default_grouping_and_since_until_filter(owner, usage_rows):
    assert stats(owner)["group_by"] == "model"
    since = stats(owner, since="2025-03-02T00:00:00Z")["results"]
    assert {r["key"]: r["requests"] for r in since} == {"acme-local": 1, "claude-sonnet-4": 1, "gpt-4o": 1}
    until = stats(owner, until="2025-03-02T00:00:00Z")["results"]
    assert [(r["key"], r["requests"]) for r in until] == [("gpt-4o", 1)]


def test_the_price_table_can_be_overridden(owner, usage_rows, settings):
    settings.MNEMO_PRICE_TABLE = {
        "gpt-4o": {"input": 5.0, "cached_input": 0.5},
        "acme-local": {"input": 1.0, "cached_input": 0.1},
    }
    results = {r["key"]: r for r in stats(owner)["results"]}
    assert results["gpt-4o"]["savings_usd"] == pytest.approx(3072 * 4.5 / 1e6)
    assert results["acme-local"]["unpriced_models"] == []
    assert results["claude-sonnet-4"]["savings_usd"] == 0.02085  # untouched defaults still apply


def test_reported_context_calls_show_up(owner, conversation):
    first = context(owner, conversation, user_message="one")
    context(owner, conversation, user_message="two")  # never reported
    usage = {"prompt_tokens": 1200, "prompt_tokens_details": {"cached_tokens": 1024}}
    url = f"/api/v1/conversations/{conversation.id}/usage"
    owner.client.post(url, {"usage": usage, "context_id": first["context_id"]}, format="json")
    [result] = stats(owner)["results"]
    assert (result["key"], result["requests"], result["prompt_tokens"], result["cached_tokens"]) == (
        "gpt-4o",
        1,
        1200,
        1024,
    )
    assert result["prediction_mean_abs_error_tokens"] == 1024.0  # predicted 0 on a first call


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"group_by": "week"}, "invalid_choice"),
        ({"since": "yesterday"}, "invalid"),
        ({"until": "2025-13-01"}, "invalid"),
        ({"group": "model"}, "unknown_field"),
    ],
)
def test_bad_filters_are_400(owner, params, code):
    response = owner.client.get(STATS, params)
    assert response.status_code == 400
    assert error_code(response) == code


def test_each_tenant_sees_only_its_own_rows(owner, outsider, usage_rows):
    [theirs] = stats(outsider)["results"]
    assert (theirs["key"], theirs["requests"], theirs["prompt_tokens"]) == ("gpt-4o", 1, 50_000)
    for group_by in ("model", "day", "conversation"):
        rows = stats(owner, group_by=group_by)["results"]
        assert sum(r["requests"] for r in rows) == 4
        assert 50_000 not in [r["prompt_tokens"] for r in rows]


def test_anonymous_gets_401(anonymous):
    assert anonymous.get(STATS).status_code == 401
