"""The LLM client against an OpenAI-compatible server on 127.0.0.1, through the real openai package: good
replies, timeouts, 5xx retried with backoff, 4xx and malformed replies failing at once, usage counting, and
configuration from settings with per-tenant overrides."""

import time

import pytest

from providers.llm import (
    FALLBACK_MODEL,
    LLMBadResponse,
    LLMConfig,
    LLMNotConfigured,
    LLMRejected,
    LLMTimeout,
    LLMUnavailable,
    chat,
    llm_config,
)
from tests.llm_server import client_config

MESSAGES = [{"role": "system", "content": "Summarise."}, {"role": "user", "content": "We chose port 8443."}]


config = client_config


def test_a_good_reply_comes_back_with_the_providers_usage(llm_server):
    llm_server.reply = "Decisions: port 8443."
    reply = chat(config(llm_server), MESSAGES, max_tokens=50)
    assert reply.text == "Decisions: port 8443."
    assert (reply.prompt_tokens, reply.completion_tokens, reply.usage_reported) == (120, 30, True)
    assert reply.attempts == 1
    (request,) = llm_server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["auth"] == "Bearer k"
    assert request["body"]["model"] == "test-model"
    assert request["body"]["messages"] == MESSAGES
    assert request["body"]["max_tokens"] == 50


def test_a_reply_without_usage_is_counted_by_us(llm_server):
    llm_server.script("no_usage")
    reply = chat(config(llm_server), MESSAGES, max_tokens=50)
    assert reply.usage_reported is False
    assert reply.prompt_tokens > 10 and reply.completion_tokens > 3


def test_a_slow_reply_times_out_and_is_retried_then_fails(llm_server):
    llm_server.slow_seconds = 1.0
    llm_server.script("slow", "slow")
    started = time.perf_counter()
    with pytest.raises(LLMTimeout) as caught:
        chat(config(llm_server, timeout=0.2, retries=1), MESSAGES, max_tokens=50)
    assert caught.value.attempts == 2
    assert caught.value.code == "llm_timeout"
    assert time.perf_counter() - started < 1.5  # the client gave up; it did not wait for the replies
    assert len(llm_server.requests) == 2


def test_a_500_is_retried_with_backoff_and_the_retry_succeeds(llm_server):
    llm_server.script("500", "429", "good")
    sleeps: list[float] = []
    reply = chat(config(llm_server, retries=2), MESSAGES, max_tokens=50, sleep=sleeps.append)
    assert reply.attempts == 3
    assert len(llm_server.requests) == 3
    # Exponential: the second wait is about twice the first (±20 % jitter).
    assert len(sleeps) == 2 and 0.008 <= sleeps[0] <= 0.012 and 0.016 <= sleeps[1] <= 0.024


def test_500_on_every_attempt_ends_as_unavailable(llm_server):
    llm_server.default = "500"
    with pytest.raises(LLMUnavailable) as caught:
        chat(config(llm_server, retries=2), MESSAGES, max_tokens=50, sleep=lambda s: None)
    assert caught.value.attempts == 3
    assert caught.value.status == 500
    assert len(llm_server.requests) == 3


@pytest.mark.parametrize("behaviour", ["malformed", "empty"])
def test_a_malformed_reply_fails_at_once_without_retry(llm_server, behaviour):
    llm_server.script(behaviour)
    with pytest.raises(LLMBadResponse):
        chat(config(llm_server), MESSAGES, max_tokens=50, sleep=lambda s: None)
    assert len(llm_server.requests) == 1


def test_a_4xx_is_rejected_without_retry(llm_server):
    llm_server.script("401")
    with pytest.raises(LLMRejected) as caught:
        chat(config(llm_server), MESSAGES, max_tokens=50, sleep=lambda s: None)
    assert caught.value.status == 401
    assert len(llm_server.requests) == 1


def test_an_unreachable_endpoint_is_unavailable():
    unreachable = LLMConfig(
        base_url="http://127.0.0.1:9/v1", api_key="k", model="m", timeout=0.5, max_retries=0, backoff=0
    )
    with pytest.raises(LLMUnavailable):
        chat(unreachable, MESSAGES, max_tokens=10)


def test_no_endpoint_is_not_configured():
    with pytest.raises(LLMNotConfigured):
        chat(None, MESSAGES, max_tokens=10)


def test_configuration_from_settings_with_tenant_overrides(settings):
    settings.LLM_BASE_URL = ""
    settings.LLM_API_KEY = ""
    settings.LLM_MODEL = ""
    assert llm_config() is None  # nothing configured: the offline path serves
    assert llm_config({"llm_model": "x"}) is None  # a model alone names no endpoint

    settings.LLM_API_KEY = "sk-test"
    openai_default = llm_config()
    assert (openai_default.base_url, openai_default.api_key, openai_default.model) == (
        None,
        "sk-test",
        FALLBACK_MODEL,
    )
    assert "sk-test" not in openai_default.describe()

    # An Ollama endpoint needs no key; the tenant's own endpoint and model win.
    tenant = llm_config({"llm_base_url": "http://127.0.0.1:11434/v1", "llm_model": "llama3.1"})
    assert (tenant.base_url, tenant.model) == ("http://127.0.0.1:11434/v1", "llama3.1")
    assert llm_config({"llm_enabled": False}) is None

    settings.LLM_API_KEY = ""
    settings.LLM_BASE_URL = "http://127.0.0.1:8001/v1"
    vllm = llm_config()
    assert vllm.api_key and vllm.base_url == "http://127.0.0.1:8001/v1"


def test_request_path_limits_only_tighten():
    base = LLMConfig(base_url=None, api_key="k", model="m", timeout=30, max_retries=2, backoff=1)
    tight = base.with_limits(timeout=5, max_retries=0)
    assert (tight.timeout, tight.max_retries) == (5, 0)
    assert base.with_limits(timeout=60).timeout == 30
