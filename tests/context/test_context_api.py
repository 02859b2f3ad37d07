"""POST /api/v1/conversations/{id}/context: the current message by text or by stored id, input validation,
model and format choice, and who may call it."""

import uuid

import pytest

from conversations.services import conversation_create
from prefix_cache.models import CacheUsage
from tests.context.helpers import append, context, context_call, context_url, error_code

pytestmark = pytest.mark.django_db


def test_user_message_id_stops_the_history_before_that_message_and_makes_it_current(owner, conversation):
    messages = append(
        conversation,
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "third, already stored"},
        {"role": "assistant", "content": "written after it"},
    )
    body = context(owner, conversation, user_message_id=str(messages[4].id))
    assert body["messages"] == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "third, already stored"},
    ]
    assert body["blocks"]["B6"]["to_seq"] == 4

    earliest = context(owner, conversation, user_message_id=str(messages[0].id), format="gemini")
    assert earliest["messages"] == [{"role": "user", "parts": [{"text": "first"}]}]
    assert "B6" not in earliest["blocks"]


def test_user_message_id_must_name_a_user_message_of_this_conversation(owner, conversation):
    [_question, answer] = append(
        conversation, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
    )
    other = conversation_create(tenant=owner.tenant, title="other")
    [elsewhere] = append(other, {"role": "user", "content": "elsewhere"})
    for bad in (answer.id, elsewhere.id, uuid.uuid4()):
        response = context_call(owner, conversation, user_message_id=str(bad))
        assert response.status_code == 400
        assert error_code(response) == "invalid_user_message"
    assert CacheUsage.objects.count() == 0


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"user_message": "text", "user_message_id": "00000000-0000-0000-0000-000000000001"},
        {"token_budget": 900},
    ],
    ids=["neither", "both", "neither-with-other-fields"],
)
def test_exactly_one_of_user_message_and_user_message_id(owner, conversation, body):
    response = context_call(owner, conversation, **body)
    assert response.status_code == 400
    assert error_code(response) == "invalid_user_message"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"token_budget": 255}, "min_value"),
        ({"token_budget": 200_000}, "budget_exceeds_window"),
        ({"token_budget": 10_000, "model": "gpt-4"}, "budget_exceeds_window"),
        ({"token_budget": "many"}, "invalid"),
        ({"format": "cohere"}, "invalid_choice"),
        ({"attachments": "report.csv"}, "not_a_list"),
        ({"attachments": [{"name": "a.txt", "size": 3}]}, "unknown_field"),
        ({"attachments": [{"description": "no name"}]}, "required"),
        ({"temperature": 0.2}, "unknown_field"),
        ({"retrieval": {"top_k": 0}}, "min_value"),
        ({"agent_profile": "not-a-uuid"}, "invalid"),
    ],
)
def test_bad_input_is_a_400_with_a_code(owner, conversation, body, code):
    response = context_call(owner, conversation, user_message="hi", **body)
    assert response.status_code == 400, response.content
    assert error_code(response) == code
    assert CacheUsage.objects.count() == 0


def test_budget_over_the_window_names_the_window(owner, conversation):
    response = context_call(owner, conversation, user_message="hi", token_budget=128_001)
    assert response.json()["error"]["extra"] == {"context_window": 128_000}
    assert context(owner, conversation, user_message="hi", token_budget=128_000)["token_budget"] == 128_000


@pytest.mark.parametrize(
    ("model", "fmt"),
    [("gpt-4o-mini", "openai"), ("claude-3-5-haiku-20241022", "anthropic"), ("gemini-2.5-flash", "gemini")],
)
def test_the_format_follows_the_models_provider_unless_given(owner, conversation, model, fmt):
    body = context(owner, conversation, user_message="hi", model=model)
    assert (body["model"], body["format"]) == (model, fmt)
    assert context(owner, conversation, user_message="hi", model=model, format="openai")["format"] == "openai"
    assert CacheUsage.objects.filter(model=model).count() == 2


def test_an_unknown_model_is_served_and_reported_as_a_degradation(owner, conversation):
    body = context(owner, conversation, user_message="hi", model="acme-llm-7b")
    assert body["format"] == "openai"
    assert body["tokens"]["exact"] is False
    assert [(d["stage"], d["code"]) for d in body["degradations"]] == [("load", "unknown_model")]


def test_the_response_reports_timings_for_every_stage(owner, conversation):
    body = context(owner, conversation, user_message="hi")
    assert list(body["timings"]) == [
        "load",
        "overlay",
        "rewrite",
        "retrieve",
        "decay",
        "budget",
        "render",
        "hint",
    ]
    assert all(isinstance(ms, float | int) and ms >= 0 for ms in body["timings"].values())


def test_the_outsider_gets_404_and_nothing_is_recorded(outsider, conversation):
    append(conversation, {"role": "user", "content": "private"})
    response = context_call(outsider, conversation, user_message="hi")
    assert response.status_code == 404
    assert error_code(response) == "not_found"
    assert CacheUsage.objects.count() == 0


def test_the_outsider_cannot_name_the_owners_message(owner, outsider, conversation, outsider_conversation):
    [private] = append(conversation, {"role": "user", "content": "private"})
    response = context_call(outsider, outsider_conversation, user_message_id=str(private.id))
    assert response.status_code == 400
    assert error_code(response) == "invalid_user_message"
    assert "private" not in response.content.decode()


def test_anonymous_gets_401(anonymous, conversation):
    response = anonymous.post(context_url(conversation), {"user_message": "hi"}, format="json")
    assert response.status_code == 401
    assert CacheUsage.objects.count() == 0


def test_an_unknown_or_malformed_conversation_is_404(owner):
    for conversation_id in (uuid.uuid4(), "nope"):
        response = owner.client.post(context_url(str(conversation_id)), {"user_message": "hi"}, format="json")
        assert response.status_code == 404
