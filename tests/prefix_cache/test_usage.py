"""Provider usage, taken as the providers return it: parsing of real response shapes, POST …/usage matched
to its context call, and the `usage` field of an appended assistant message."""

import copy
import uuid

import pytest

from conversations.models import Message
from conversations.services import conversation_create
from prefix_cache.models import CacheUsage
from prefix_cache.usage import ParsedUsage, usage_parse
from tenants.errors import ApplicationError
from tests.context.helpers import context, error_code

pytestmark = pytest.mark.django_db

# Whole response bodies, as the providers' HTTP APIs return them.
OPENAI_CHAT_COMPLETION = {
    "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
    "object": "chat.completion",
    "created": 1741569952,
    "model": "gpt-4o-2024-08-06",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Ticket 882 is still open.",
                "refusal": None,
                "annotations": [],
            },
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {
        "prompt_tokens": 2006,
        "completion_tokens": 300,
        "total_tokens": 2306,
        "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    },
    "service_tier": "default",
    "system_fingerprint": "fp_50cad350e4",
}

OPENAI_RESPONSES_API = {
    "id": "resp_67ccd3a9da748190baa7f1570fe91ac604becb25c45c1d41",
    "object": "response",
    "created_at": 1741476777,
    "status": "completed",
    "error": None,
    "incomplete_details": None,
    "instructions": None,
    "max_output_tokens": None,
    "model": "gpt-4.1-2025-04-14",
    "output": [
        {
            "type": "message",
            "id": "msg_67ccd3acc8d48190a77525dc6de64b4104becb25c45c1d41",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Ticket 882 is still open.", "annotations": []}],
        }
    ],
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": {"effort": None, "summary": None},
    "store": True,
    "temperature": 1.0,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "truncation": "disabled",
    "usage": {
        "input_tokens": 1536,
        "input_tokens_details": {"cached_tokens": 1408},
        "output_tokens": 52,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 1588,
    },
    "user": None,
    "metadata": {},
}

ANTHROPIC_MESSAGE = {
    "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-20250514",
    "content": [{"type": "text", "text": "Ticket 882 is still open."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 21,
        "cache_creation_input_tokens": 188,
        "cache_read_input_tokens": 1800,
        "cache_creation": {"ephemeral_5m_input_tokens": 188, "ephemeral_1h_input_tokens": 0},
        "output_tokens": 393,
        "service_tier": "standard",
    },
}

GEMINI_GENERATE_CONTENT = {
    "candidates": [
        {
            "content": {"parts": [{"text": "Ticket 882 is still open."}], "role": "model"},
            "finishReason": "STOP",
            "avgLogprobs": -0.0731,
        }
    ],
    "usageMetadata": {
        "promptTokenCount": 2100,
        "candidatesTokenCount": 45,
        "totalTokenCount": 2145,
        "cachedContentTokenCount": 1536,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 2100}],
        "cacheTokensDetails": [{"modality": "TEXT", "tokenCount": 1536}],
        "candidatesTokensDetails": [{"modality": "TEXT", "tokenCount": 45}],
    },
    "modelVersion": "gemini-2.5-flash",
    "responseId": "mGAYaLfVKvOUmNAPsLWy8Ac",
}

# The google-genai Python SDK's model_dump() of the same response.
GEMINI_SNAKE_CASE = {
    "candidates": [{"content": {"parts": [{"text": "Open."}], "role": "model"}, "finish_reason": "STOP"}],
    "usage_metadata": {
        "prompt_token_count": 2100,
        "candidates_token_count": 45,
        "total_token_count": 2145,
        "cached_content_token_count": 1536,
    },
    "model_version": "gemini-2.5-flash",
}


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (OPENAI_CHAT_COMPLETION, ParsedUsage("openai", 2006, 1920, None, 300)),
        (OPENAI_CHAT_COMPLETION["usage"], ParsedUsage("openai", 2006, 1920, None, 300)),
        (OPENAI_RESPONSES_API, ParsedUsage("openai", 1536, 1408, None, 52)),
        # Anthropic's input_tokens leave out cache reads and writes: the prompt is all three.
        (ANTHROPIC_MESSAGE, ParsedUsage("anthropic", 21 + 1800 + 188, 1800, 188, 393)),
        (ANTHROPIC_MESSAGE["usage"], ParsedUsage("anthropic", 2009, 1800, 188, 393)),
        (GEMINI_GENERATE_CONTENT, ParsedUsage("gemini", 2100, 1536, None, 45)),
        (GEMINI_GENERATE_CONTENT["usageMetadata"], ParsedUsage("gemini", 2100, 1536, None, 45)),
        (GEMINI_SNAKE_CASE, ParsedUsage("gemini", 2100, 1536, None, 45)),
        ({"prompt_tokens": 900, "completion_tokens": 5}, ParsedUsage("openai", 900, 0, None, 5)),
        ({"promptTokenCount": 900}, ParsedUsage("gemini", 900, 0, None, None)),
    ],
    ids=[
        "openai-chat",
        "openai-chat-usage",
        "openai-responses",
        "anthropic",
        "anthropic-usage",
        "gemini",
        "gemini-usage-metadata",
        "gemini-snake-case",
        "openai-no-cache",
        "gemini-no-cache",
    ],
)
def test_usage_parse_reads_each_providers_shape(payload, expected):
    assert usage_parse(copy.deepcopy(payload)) == expected


def test_an_anthropic_usage_without_cache_fields_follows_the_provider_given():
    usage = {"input_tokens": 40, "output_tokens": 7}
    assert usage_parse(usage, provider="anthropic") == ParsedUsage("anthropic", 40, 0, 0, 7)
    assert usage_parse(usage, default_provider="anthropic").provider == "anthropic"


def bad(path, value):
    payload = copy.deepcopy(OPENAI_CHAT_COMPLETION["usage"])
    *parents, leaf = path
    target = payload
    for key in parents:
        target = target[key]
    if value is KeyError:
        del target[leaf]
    else:
        target[leaf] = value
    return payload


BAD_USAGES = [
    bad(["prompt_tokens"], -1),
    bad(["prompt_tokens"], "2006"),
    bad(["prompt_tokens"], 20.5),
    bad(["prompt_tokens"], True),
    bad(["prompt_tokens_details", "cached_tokens"], 3000),  # cached > prompt
    bad(["prompt_tokens_details", "cached_tokens"], -5),
    bad(["prompt_tokens_details"], [1920]),
    bad(["prompt_tokens"], KeyError),
    {"input_tokens": 10, "cache_read_input_tokens": "many"},
    {"cache_read_input_tokens": 10},  # Anthropic without input_tokens
    {"promptTokenCount": 10, "cachedContentTokenCount": 11},
    {"usageMetadata": {"candidatesTokenCount": 3}},
    {"usage": "lots"},
    {},
]


@pytest.mark.parametrize("payload", [*BAD_USAGES, [1, 2], "usage", None, 7])
def test_usage_parse_refuses_bad_usage(payload):
    with pytest.raises(ApplicationError) as raised:
        usage_parse(payload)
    assert raised.value.code == "invalid_usage"


def test_usage_parse_refuses_an_unknown_provider():
    with pytest.raises(ApplicationError) as raised:
        usage_parse({"prompt_tokens": 1}, provider="cohere")
    assert raised.value.code == "invalid_usage"


# --- POST /api/v1/conversations/{id}/usage ---------------------------------------------------------------


def usage_url(conversation):
    return f"/api/v1/conversations/{conversation.id}/usage"


def report(actor, conversation, **body):
    return actor.client.post(usage_url(conversation), body, format="json")


def test_usage_is_matched_to_the_named_context_call(owner, conversation):
    first = context(owner, conversation, user_message="one")
    second = context(owner, conversation, user_message="two")
    response = report(owner, conversation, usage=OPENAI_CHAT_COMPLETION, context_id=first["context_id"])
    assert response.status_code == 200, response.content
    assert response.json() == {
        "context_id": first["context_id"],
        "provider": "openai",
        "model": "gpt-4o",
        "prompt_tokens": 2006,
        "cached_tokens": 1920,
        "cache_write_tokens": None,
        "completion_tokens": 300,
        "predicted_prompt_tokens": first["tokens"]["total"],
        "predicted_cacheable_tokens": 0,
        "hint_level": "",
    }
    row = CacheUsage.objects.get(pk=first["context_id"])
    assert row.reported_at is not None
    assert CacheUsage.objects.get(pk=second["context_id"]).reported_at is None

    again = report(owner, conversation, usage=OPENAI_CHAT_COMPLETION, context_id=first["context_id"])
    assert again.status_code == 409
    assert error_code(again) == "usage_already_reported"
    assert CacheUsage.objects.get(pk=first["context_id"]).reported_at == row.reported_at


def test_without_a_context_id_the_latest_pending_call_is_completed(owner, conversation):
    older = context(owner, conversation, user_message="one")
    newer = context(owner, conversation, user_message="two")
    anthropic = report(owner, conversation, usage=ANTHROPIC_MESSAGE).json()
    assert anthropic["context_id"] == newer["context_id"]
    assert (anthropic["provider"], anthropic["prompt_tokens"], anthropic["cache_write_tokens"]) == (
        "anthropic",
        2009,
        188,
    )
    gemini = report(owner, conversation, usage=GEMINI_GENERATE_CONTENT).json()
    assert gemini["context_id"] == older["context_id"]
    assert (gemini["provider"], gemini["cached_tokens"]) == ("gemini", 1536)

    # Nothing pending: a row of its own, with no prediction.
    extra = report(owner, conversation, usage=OPENAI_RESPONSES_API).json()
    assert extra["context_id"] not in (older["context_id"], newer["context_id"])
    assert (extra["predicted_prompt_tokens"], extra["hint_level"], extra["cached_tokens"]) == (0, "", 1408)
    assert CacheUsage.objects.filter(conversation=conversation).count() == 3


def test_the_provider_can_be_named(owner, conversation):
    context(owner, conversation, user_message="one")
    body = report(
        owner, conversation, usage={"input_tokens": 40, "output_tokens": 7}, provider="anthropic"
    ).json()
    assert (body["provider"], body["prompt_tokens"], body["cached_tokens"]) == ("anthropic", 40, 0)


def test_an_unknown_context_id_is_404(owner, conversation):
    other = conversation_create(tenant=owner.tenant, title="other")
    elsewhere = context(owner, other, user_message="hi")
    for context_id in (str(uuid.uuid4()), elsewhere["context_id"]):
        response = report(owner, conversation, usage=OPENAI_CHAT_COMPLETION, context_id=context_id)
        assert response.status_code == 404
    assert CacheUsage.objects.get(pk=elsewhere["context_id"]).reported_at is None
    assert not CacheUsage.objects.filter(conversation=conversation).exists()


@pytest.mark.parametrize("usage", BAD_USAGES)
def test_a_bad_usage_is_400_and_nothing_is_recorded(owner, conversation, usage):
    pending = context(owner, conversation, user_message="one")
    response = report(owner, conversation, usage=usage, context_id=pending["context_id"])
    assert response.status_code == 400
    assert error_code(response) == "invalid_usage"
    response = report(owner, conversation, usage=usage)
    assert error_code(response) == "invalid_usage"
    row = CacheUsage.objects.get()
    assert (row.prompt_tokens, row.cached_tokens, row.reported_at) == (None, None, None)


@pytest.mark.parametrize("usage", [[1920], "2006 tokens", 7])
def test_a_usage_that_is_not_an_object_is_invalid_usage(owner, conversation, usage):
    response = report(owner, conversation, usage=usage)
    assert response.status_code == 400
    assert error_code(response) == "invalid_usage"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "required"),
        ({"usage": OPENAI_CHAT_COMPLETION["usage"], "provider": "cohere"}, "invalid_choice"),
        ({"usage": OPENAI_CHAT_COMPLETION["usage"], "context_id": "ctx-1"}, "invalid"),
        ({"usage": OPENAI_CHAT_COMPLETION["usage"], "cost": 1}, "unknown_field"),
    ],
)
def test_bad_usage_requests(owner, conversation, body, code):
    response = owner.client.post(usage_url(conversation), body, format="json")
    assert response.status_code == 400
    assert error_code(response) == code


def test_the_outsider_and_anonymous_cannot_report(owner, outsider, anonymous, conversation):
    pending = context(owner, conversation, user_message="one")
    body = {"usage": OPENAI_CHAT_COMPLETION, "context_id": pending["context_id"]}
    assert outsider.client.post(usage_url(conversation), body, format="json").status_code == 404
    assert anonymous.post(usage_url(conversation), body, format="json").status_code == 401
    assert CacheUsage.objects.get().reported_at is None


def test_the_outsider_cannot_complete_the_owners_call_through_its_own_conversation(
    owner, outsider, conversation, outsider_conversation
):
    pending = context(owner, conversation, user_message="one")
    response = report(
        outsider, outsider_conversation, usage=OPENAI_CHAT_COMPLETION, context_id=pending["context_id"]
    )
    assert response.status_code == 404
    assert CacheUsage.objects.get(pk=pending["context_id"]).reported_at is None


# --- the `usage` field of an appended assistant message ------------------------------------------------


def messages_url(conversation):
    return f"/api/v1/conversations/{conversation.id}/messages"


def test_an_assistant_message_with_usage_completes_the_pending_call(owner, conversation):
    pending = context(owner, conversation, user_message="Status of 882?")
    reply = {"role": "assistant", "content": "Still open.", "usage": OPENAI_CHAT_COMPLETION["usage"]}
    response = owner.client.post(messages_url(conversation), reply, format="json")
    assert response.status_code == 201, response.content
    row = CacheUsage.objects.get(pk=pending["context_id"])
    assert (row.provider, row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (
        "openai",
        2006,
        1920,
        300,
    )
    assert row.reported_at is not None
    assert Message.objects.get(pk=response.json()["id"]).content == "Still open."


def test_a_replayed_append_does_not_report_its_usage_twice(owner, conversation):
    context(owner, conversation, user_message="one")
    reply = {"role": "assistant", "content": "Done.", "usage": GEMINI_GENERATE_CONTENT}
    headers = {"Idempotency-Key": "reply-1"}
    assert (
        owner.client.post(messages_url(conversation), reply, format="json", headers=headers).status_code
        == 201
    )
    later = context(owner, conversation, user_message="two")
    replay = owner.client.post(messages_url(conversation), reply, format="json", headers=headers)
    assert replay.status_code == 200
    assert CacheUsage.objects.get(pk=later["context_id"]).reported_at is None
    assert CacheUsage.objects.filter(reported_at__isnull=False).count() == 1


def test_usage_on_a_user_message_is_refused_and_nothing_is_stored(owner, conversation):
    context(owner, conversation, user_message="one")
    body = {"role": "user", "content": "hi", "usage": OPENAI_CHAT_COMPLETION["usage"]}
    response = owner.client.post(messages_url(conversation), body, format="json")
    assert response.status_code == 400
    assert error_code(response) == "usage_not_allowed"
    assert not Message.objects.filter(conversation=conversation).exists()
    assert CacheUsage.objects.get().reported_at is None


@pytest.mark.parametrize("usage", [BAD_USAGES[0], BAD_USAGES[4], BAD_USAGES[7], {}])
def test_an_invalid_usage_on_append_stores_nothing(owner, conversation, usage):
    context(owner, conversation, user_message="one")
    body = {"role": "assistant", "content": "reply", "usage": usage}
    response = owner.client.post(messages_url(conversation), body, format="json")
    assert response.status_code == 400
    assert error_code(response) == "invalid_usage"
    assert not Message.objects.filter(conversation=conversation).exists()
    conversation.refresh_from_db()
    assert conversation.last_seq == 0
    assert CacheUsage.objects.get().reported_at is None


def test_an_invalid_usage_in_a_batch_stores_none_of_the_batch(owner, conversation):
    batch = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "usage": {"prompt_tokens": -1}},
        ]
    }
    response = owner.client.post(messages_url(conversation), batch, format="json")
    assert response.status_code == 400
    assert error_code(response) == "invalid_usage"
    assert not Message.objects.filter(conversation=conversation).exists()
