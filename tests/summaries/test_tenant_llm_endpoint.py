"""Compaction and query rewriting when the tenant names its own LLM endpoint: the platform's key never goes
there, and a URL the operator does not allow degrades to the offline path (extractive summary, rewrite
rules) with a degradation that names neither the URL nor an address. Two OpenAI-compatible test servers on
127.0.0.1 record the Authorization header each received: the platform's and the tenant's."""

import pytest
from django.core.cache import cache

from retrieval.rewrite import query_rewrite
from summaries.services import compaction_run
from tests.llm_server import LLMServer
from tests.summaries.helpers import append, budgets, history

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant_server():
    server = LLMServer().start()
    try:
        yield server
    finally:
        server.stop()
        cache.clear()  # a failed rewrite pauses the endpoint; the next test may get the same port


@pytest.fixture
def loopback_allowed(llm_settings):
    """The operator allows tenant endpoints on 127.0.0.1 (where the test servers listen)."""
    llm_settings.MNEMO_TENANT_LLM_HOSTS = ["127.0.0.1"]
    llm_settings.MNEMO_TENANT_LLM_PRIVATE_NETWORKS = ["127.0.0.1/32"]
    return llm_settings


def leaks(message: str, server: LLMServer) -> list[str]:
    host, port = server.httpd.server_address[:2]
    return [part for part in (server.base_url, host, f":{port}") if part in message]


def test_compaction_at_the_tenants_endpoint_sends_no_platform_key(
    conversation, llm_settings, llm_server, tenant_server, loopback_allowed
):
    budgets(conversation.tenant, llm_base_url=tenant_server.base_url)
    history(conversation, 20)
    outcome = compaction_run(conversation=conversation, trigger="auto", sync=False)

    assert outcome.source == "llm" and outcome.degradations == []
    assert [r["auth"] for r in tenant_server.requests] == [None]  # no key of its own: none at all
    assert llm_server.requests == []


def test_compaction_at_the_tenants_endpoint_sends_the_tenants_key(
    conversation, llm_settings, llm_server, tenant_server, loopback_allowed
):
    budgets(conversation.tenant, llm_base_url=tenant_server.base_url, llm_api_key="sk-tenant")
    history(conversation, 20)
    compaction_run(conversation=conversation, trigger="auto", sync=False)
    assert [r["auth"] for r in tenant_server.requests] == ["Bearer sk-tenant"]


@pytest.mark.parametrize("allowed_host", [False, True], ids=["host-not-allowed", "loopback-address"])
def test_a_refused_tenant_url_gets_the_extractive_summary_and_a_degradation_without_the_url(
    conversation, llm_settings, llm_server, tenant_server, allowed_host
):
    # By default no tenant host is allowed; an allowed host on a loopback address is refused as well.
    if allowed_host:
        llm_settings.MNEMO_TENANT_LLM_HOSTS = ["127.0.0.1"]
    budgets(conversation.tenant, llm_base_url=tenant_server.base_url)
    history(conversation, 20)
    outcome = compaction_run(conversation=conversation, trigger="auto", sync=False)

    assert tenant_server.requests == [] and llm_server.requests == []
    assert outcome.source == outcome.segments[0].source == "extractive"
    (degradation,) = outcome.degradations
    assert degradation["code"] == "llm_failed"
    assert "[llm_endpoint_refused]" in degradation["message"]
    assert leaks(degradation["message"], tenant_server) == []
    assert leaks(degradation["message"], llm_server) == []


def test_the_query_rewrite_at_the_tenants_endpoint_sends_the_tenants_key(
    conversation, llm_settings, llm_server, tenant_server, loopback_allowed
):
    budgets(conversation.tenant, llm_base_url=tenant_server.base_url, llm_api_key="sk-tenant")
    append(conversation, {"role": "user", "content": "Please deploy services/billing/api.py to staging-eu."})
    tenant_server.reply = "Query: Did the deploy of services/billing/api.py pass?"
    rewrite = query_rewrite(conversation=conversation, query="Did it pass?")
    assert rewrite.method == "llm"
    assert [r["auth"] for r in tenant_server.requests] == ["Bearer sk-tenant"]
    assert llm_server.requests == []


def test_a_refused_tenant_url_leaves_the_query_rewrite_to_the_rules(
    conversation, llm_settings, llm_server, tenant_server
):
    budgets(conversation.tenant, llm_base_url=tenant_server.base_url)
    append(conversation, {"role": "user", "content": "Please deploy services/billing/api.py to staging-eu."})
    rewrite = query_rewrite(conversation=conversation, query="Did it pass?")

    assert rewrite.method == "rules"
    assert tenant_server.requests == [] and llm_server.requests == []
    (degradation,) = rewrite.degradations
    assert degradation["code"] == "query_rewrite_llm_failed"
    assert "[llm_endpoint_refused]" in degradation["message"]
    assert leaks(degradation["message"], tenant_server) == []
