"""The proxy's upstream under the tenant-endpoint rules (providers/egress.py): a tenant's own URL gets the
tenant's key or none, never the platform's, and is called only when the operator allows its host; and a
completed exchange through the proxy triggers the background work any exchange does."""

import anthropic
import openai
import pytest

from conversations.signals import exchange_completed
from tests.proxy.conftest import UPSTREAM_KEY

pytestmark = pytest.mark.django_db(transaction=True)


def _tenant_endpoint(owner, llm_server, proxy_settings, **extra):
    proxy_settings.MNEMO_TENANT_LLM_HOSTS = ["127.0.0.1"]
    proxy_settings.MNEMO_TENANT_LLM_PRIVATE_NETWORKS = ["127.0.0.1/32"]
    owner.tenant.settings = {
        **(owner.tenant.settings or {}),
        "llm_base_url": llm_server.base_url,
        "anthropic_base_url": llm_server.base_url.removesuffix("/v1"),
        **extra,
    }
    owner.tenant.save()


def test_a_tenant_url_never_gets_the_platform_key(owner, mnemo_url, llm_server, proxy_settings):
    _tenant_endpoint(owner, llm_server, proxy_settings)
    openai.OpenAI(base_url=f"{mnemo_url}/v1", api_key=owner.raw_key, max_retries=0).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    anthropic.Anthropic(base_url=mnemo_url, api_key=owner.raw_key, max_retries=0).messages.create(
        model="claude-3-5-sonnet", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    )
    assert [(r["auth"], r["x_api_key"]) for r in llm_server.requests] == [(None, None), (None, None)]


def test_a_tenant_url_gets_the_tenants_own_key(owner, mnemo_url, llm_server, proxy_settings):
    _tenant_endpoint(owner, llm_server, proxy_settings, llm_api_key="tenant-key", anthropic_api_key="t-key")
    openai.OpenAI(base_url=f"{mnemo_url}/v1", api_key=owner.raw_key, max_retries=0).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
    ).close()
    anthropic.Anthropic(base_url=mnemo_url, api_key=owner.raw_key, max_retries=0).messages.create(
        model="claude-3-5-sonnet", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    )
    assert llm_server.requests[0]["auth"] == "Bearer tenant-key"
    assert llm_server.requests[1]["x_api_key"] == "t-key"
    assert all(UPSTREAM_KEY not in str(r) for r in llm_server.requests)


def test_a_tenant_url_the_operator_does_not_allow_is_refused(owner, mnemo_url, llm_server, proxy_settings):
    _tenant_endpoint(owner, llm_server, proxy_settings)
    proxy_settings.MNEMO_TENANT_LLM_PRIVATE_NETWORKS = []  # 127.0.0.1 is loopback: refused
    with pytest.raises(openai.APIStatusError) as raised:
        openai.OpenAI(
            base_url=f"{mnemo_url}/v1", api_key=owner.raw_key, max_retries=0
        ).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.status_code == 502
    assert raised.value.body["code"] == "upstream_refused"
    assert "127.0.0.1" not in raised.value.message
    assert llm_server.requests == []


def test_a_completed_reply_triggers_the_background_work_of_an_exchange(owner, mnemo_url, llm_server):
    triggered = []

    def receiver(sender, *, conversation, **kwargs):
        triggered.append(str(conversation.pk))

    exchange_completed.connect(receiver, weak=False)
    try:
        raw = openai.OpenAI(
            base_url=f"{mnemo_url}/v1", api_key=owner.raw_key, max_retries=0
        ).chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
    finally:
        exchange_completed.disconnect(receiver)
    assert triggered == [raw.headers["x-mnemo-conversation"]]
