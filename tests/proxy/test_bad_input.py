"""Bad requests to the proxy: a 400 in the SDK's error shape with Mnemo's code, nothing stored, nothing
sent upstream."""

import json

import httpx
import pytest

from conversations.models import Conversation, Message

pytestmark = pytest.mark.django_db(transaction=True)  # the server reads the keys on its own thread

HI = [{"role": "user", "content": "hi"}]
OPENAI_CASES = [
    (b"{not json", "malformed_json", None),
    (json.dumps([1, 2]).encode(), "invalid_request", None),
    (json.dumps({"messages": HI}).encode(), "invalid_request", "model"),
    (json.dumps({"model": "gpt-4o", "messages": []}).encode(), "invalid_request", "messages"),
    (
        json.dumps({"model": "gpt-4o", "messages": [{"role": "robot", "content": "hi"}]}).encode(),
        "invalid_request",
        None,
    ),
    (
        json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": 5}]}).encode(),
        "invalid_request",
        None,
    ),
    (json.dumps({"model": "gpt-4o", "stream": "yes", "messages": HI}).encode(), "invalid_request", "stream"),
    # An unpaired surrogate escape: valid JSON, but not text (it was a 500 when the proxy hashed it).
    (
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "a \\ud800 b"}]}',
        "invalid_request",
        None,
    ),
    (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\\udc00"}]}', "invalid_request", None),
]
CLAUDE = "claude-3-5-sonnet"
ANTHROPIC_CASES = [
    (b"{not json", "malformed_json"),
    (json.dumps({"model": CLAUDE, "messages": HI}).encode(), "invalid_request"),
    (
        json.dumps(
            {"model": CLAUDE, "max_tokens": 9, "messages": [{"role": "system", "content": "x"}]}
        ).encode(),
        "invalid_request",
    ),
    (json.dumps({"model": CLAUDE, "max_tokens": 9, "system": 5, "messages": HI}).encode(), "invalid_request"),
    (
        b'{"model": "%s", "max_tokens": 9, "messages": [{"role": "user", "content": "\\uD83D"}]}'
        % CLAUDE.encode(),
        "invalid_request",
    ),
]


def test_an_escaped_pair_is_text_not_a_bad_request(owner, mnemo_url, llm_server):
    """An emoji escaped as a surrogate pair (as ensure_ascii JSON writers send it) is one character."""
    body = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "smile \\ud83d\\ude00"}]}'
    headers = {"Authorization": f"Bearer {owner.raw_key}", "Content-Type": "application/json"}
    response = httpx.post(f"{mnemo_url}/v1/chat/completions", content=body, headers=headers, timeout=30)
    assert response.status_code == 200
    assert Message.objects.filter(role="user", content="smile \U0001f600").exists()


def nothing_happened(owner, llm_server):
    assert not Conversation.objects.filter(tenant=owner.tenant).exists()
    assert not Message.objects.exists()
    assert llm_server.requests == []


@pytest.mark.parametrize("body, code, param", OPENAI_CASES)
def test_a_bad_chat_completion_is_a_400_in_openais_shape(owner, mnemo_url, llm_server, body, code, param):
    headers = {"Authorization": f"Bearer {owner.raw_key}", "Content-Type": "application/json"}
    response = httpx.post(f"{mnemo_url}/v1/chat/completions", content=body, headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", code)
    if param:
        assert error["param"] == param
    nothing_happened(owner, llm_server)


@pytest.mark.parametrize("body, code", ANTHROPIC_CASES)
def test_a_bad_message_is_a_400_in_anthropics_shape(owner, mnemo_url, llm_server, body, code):
    headers = {"x-api-key": owner.raw_key, "Content-Type": "application/json"}
    response = httpx.post(f"{mnemo_url}/v1/messages", content=body, headers=headers)
    assert response.status_code == 400
    payload = response.json()
    assert payload["type"] == "error"
    assert (payload["error"]["type"], payload["error"]["code"]) == ("invalid_request_error", code)
    nothing_happened(owner, llm_server)


@pytest.mark.parametrize(
    "path, headers, error_type",
    [
        ("/v1/chat/completions", lambda key: {"Authorization": f"Bearer {key}"}, "invalid_request_error"),
        ("/v1/messages", lambda key: {"x-api-key": key}, "request_too_large"),  # Anthropic's type for it
    ],
)
def test_a_body_over_the_limit_is_a_413_in_the_sdks_shape(
    owner, mnemo_url, llm_server, settings, path, headers, error_type
):
    """MNEMO_MAX_REQUEST_BYTES holds the proxy as it holds the API (this was a 500)."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    body = {"model": "gpt-4o", "max_tokens": 9, "messages": [{"role": "user", "content": "x" * 4096}]}
    sent = {**headers(owner.raw_key), "Content-Type": "application/json"}
    response = httpx.post(f"{mnemo_url}{path}", json=body, headers=sent, timeout=30)
    assert response.status_code == 413
    error = response.json()["error"]
    assert (error["type"], error["code"]) == (error_type, "request_too_large")
    assert "2048 bytes" in error["message"]
    nothing_happened(owner, llm_server)
