"""A tenant's own LLM endpoint (settings llm_base_url): it gets the tenant's key or none, never the
platform's; it is called only when its host is on MNEMO_TENANT_LLM_HOSTS and every address it resolves to is
public (or in MNEMO_TENANT_LLM_PRIVATE_NETWORKS), checked on the connection itself. Against the
OpenAI-compatible test server on 127.0.0.1, which records the Authorization header it received."""

import ipaddress
import socket

import pytest

from providers import egress
from providers.egress import EgressPolicy, EgressRefused
from providers.llm import LLMEndpointRefused, _client, chat, llm_config
from tests.llm_server import LLMServer

MESSAGES = [{"role": "user", "content": "Summarise: we chose port 8443."}]
PLATFORM_KEY = "sk-platform-secret"


@pytest.fixture
def tenant_server():
    server = LLMServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def platform(settings, llm_server):
    """The platform's endpoint (the test server) and key, and no tenant host allowed (the default)."""
    settings.LLM_BASE_URL = llm_server.base_url
    settings.LLM_API_KEY = PLATFORM_KEY
    settings.LLM_MODEL = "platform-model"
    settings.LLM_TIMEOUT_SECONDS = 2
    settings.LLM_MAX_RETRIES = 0
    settings.MNEMO_TENANT_LLM_HOSTS = []
    settings.MNEMO_TENANT_LLM_PRIVATE_NETWORKS = []
    _client.cache_clear()
    yield settings
    _client.cache_clear()


def fake_dns(monkeypatch, table: dict[str, list[str]]) -> None:
    """Resolve names from `table` (addresses as a resolver returns them); anything else does not resolve."""

    def resolve(host: str, port: int):
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in table[host]
        ]

    monkeypatch.setattr(egress, "resolve", resolve)


# --- which key goes where -----------------------------------------------------------------------------------


def test_a_tenant_url_never_carries_the_platform_key(platform):
    own = llm_config({"llm_base_url": "https://llm.tenant.example/v1"})
    assert (own.base_url, own.api_key, own.tenant_endpoint) == ("https://llm.tenant.example/v1", "", True)
    with_key = llm_config({"llm_base_url": "https://llm.tenant.example/v1", "llm_api_key": "sk-tenant"})
    assert with_key.api_key == "sk-tenant"
    # Without a URL of its own the tenant uses the platform's endpoint, with its own key if it has one.
    assert llm_config({}).api_key == PLATFORM_KEY
    assert llm_config({"llm_api_key": "sk-tenant"}).api_key == "sk-tenant"
    assert not llm_config({}).tenant_endpoint
    # Responses name whose endpoint, never its URL.
    assert "tenant.example" not in own.describe() and "127.0.0.1" not in llm_config({}).describe()


def test_the_tenant_endpoint_gets_the_tenants_key_or_no_authorization_at_all(
    platform, llm_server, tenant_server
):
    platform.MNEMO_TENANT_LLM_HOSTS = ["127.0.0.1"]
    platform.MNEMO_TENANT_LLM_PRIVATE_NETWORKS = ["127.0.0.1/32"]  # the test server is on loopback

    chat(llm_config({"llm_base_url": tenant_server.base_url}), MESSAGES, max_tokens=20)
    chat(
        llm_config({"llm_base_url": tenant_server.base_url, "llm_api_key": "sk-tenant"}),
        MESSAGES,
        max_tokens=20,
    )
    assert [r["auth"] for r in tenant_server.requests] == [None, "Bearer sk-tenant"]
    assert llm_server.requests == []  # the platform's endpoint saw none of it

    chat(llm_config({}), MESSAGES, max_tokens=20)
    assert [r["auth"] for r in llm_server.requests] == [f"Bearer {PLATFORM_KEY}"]


# --- which URLs are called ----------------------------------------------------------------------------------


def test_by_default_a_tenant_url_is_refused_without_a_request(platform, tenant_server):
    config = llm_config({"llm_base_url": tenant_server.base_url, "llm_api_key": "sk-tenant"})
    with pytest.raises(LLMEndpointRefused) as refused:
        chat(config, MESSAGES, max_tokens=20)
    assert tenant_server.requests == []
    assert refused.value.code == "llm_endpoint_refused" and not refused.value.retryable
    host, port = tenant_server.httpd.server_address[:2]
    assert host not in refused.value.message and str(port) not in refused.value.message


def test_an_allowed_host_on_a_loopback_address_is_refused_unless_its_network_is_allowed(
    platform, tenant_server
):
    platform.MNEMO_TENANT_LLM_HOSTS = ["127.0.0.1"]
    config = llm_config({"llm_base_url": tenant_server.base_url})
    with pytest.raises(LLMEndpointRefused):
        chat(config, MESSAGES, max_tokens=20)
    assert tenant_server.requests == []

    platform.MNEMO_TENANT_LLM_PRIVATE_NETWORKS = ["127.0.0.0/8"]
    chat(config, MESSAGES, max_tokens=20)
    assert len(tenant_server.requests) == 1


def test_a_name_is_resolved_and_the_connection_goes_to_the_address_that_was_checked(
    platform, tenant_server, monkeypatch
):
    port = tenant_server.httpd.server_address[1]
    url = f"http://llm.tenant.example:{port}/v1"
    fake_dns(monkeypatch, {"llm.tenant.example": ["127.0.0.1"]})
    platform.MNEMO_TENANT_LLM_HOSTS = ["*.tenant.example"]
    with pytest.raises(LLMEndpointRefused):  # the name is allowed, the loopback address it resolves to is not
        chat(llm_config({"llm_base_url": url}), MESSAGES, max_tokens=20)
    assert tenant_server.requests == []

    # With loopback allowed, the request reaches the server through the address the check resolved (the
    # system resolver knows no llm.tenant.example).
    platform.MNEMO_TENANT_LLM_PRIVATE_NETWORKS = ["127.0.0.1/32"]
    chat(llm_config({"llm_base_url": url, "llm_api_key": "sk-tenant"}), MESSAGES, max_tokens=20)
    assert [r["auth"] for r in tenant_server.requests] == ["Bearer sk-tenant"]


def test_every_resolved_address_must_pass(platform, monkeypatch):
    fake_dns(monkeypatch, {"mixed.tenant.example": ["93.184.216.34", "169.254.169.254"]})
    platform.MNEMO_TENANT_LLM_HOSTS = ["*"]
    policy = EgressPolicy.from_settings()
    with pytest.raises(EgressRefused, match=r"169\.254\.169\.254"):
        policy.checked_addresses("mixed.tenant.example", 443)
    with pytest.raises(EgressRefused, match="does not resolve"):
        policy.checked_addresses("nowhere.tenant.example", 443)
    fake_dns(monkeypatch, {"public.tenant.example": ["93.184.216.34", "2606:4700::1111"]})
    assert policy.checked_addresses("public.tenant.example", 443) == ["93.184.216.34", "2606:4700::1111"]


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.0.0.5",
        "172.16.3.4",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata
        "100.64.0.1",  # carrier-grade NAT
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fe80::1",
        "fd00::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    ],
)
def test_private_loopback_link_local_and_reserved_addresses_are_refused(address):
    policy = EgressPolicy(hosts=("*",), private_networks=())
    assert not policy.address_allowed(ipaddress.ip_address(address))


def test_public_addresses_and_allowed_networks_pass():
    policy = EgressPolicy(hosts=("*",), private_networks=(ipaddress.ip_network("10.20.0.0/16"),))
    for address in ("93.184.216.34", "2606:4700::1111", "10.20.1.2", "::ffff:10.20.1.2"):
        assert policy.address_allowed(ipaddress.ip_address(address)), address
    assert not policy.address_allowed(ipaddress.ip_address("10.21.0.1"))


def test_host_patterns():
    policy = EgressPolicy(hosts=("api.openai.com", "*.tenant.example"), private_networks=())
    assert policy.host_allowed("api.openai.com") and policy.host_allowed("API.OpenAI.com.")
    assert policy.host_allowed("llm.tenant.example") and policy.host_allowed("a.b.tenant.example")
    assert not policy.host_allowed("tenant.example")  # *.x is its subdomains only
    assert not policy.host_allowed("eviltenant.example")
    assert not policy.host_allowed("api.openai.com.evil.example")
    assert policy.url_refusal("https://llm.tenant.example/v1") is None
    assert policy.url_refusal("https://other.example/v1") is not None
    assert policy.url_refusal("file:///etc/passwd") is not None
    assert policy.url_refusal("https://user:pw@llm.tenant.example/v1") is not None
    assert EgressPolicy(hosts=(), private_networks=()).url_refusal("https://api.openai.com/v1") is not None
