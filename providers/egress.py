"""Calls to URLs a tenant chose (its own LLM endpoint): the host allow-list and the address check.

A tenant's `llm_base_url` is only called when its host matches MNEMO_TENANT_LLM_HOSTS, and every address the
host resolves to is public, or inside MNEMO_TENANT_LLM_PRIVATE_NETWORKS. The check runs when the connection
is made, on the addresses the connection then uses, so a name that resolves to a public address for a check
and to 169.254.169.254 a moment later (DNS rebinding) or a redirect cannot slip past it."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# An IPv6 address that carries an IPv4 one a gateway will connect to (NAT64's well-known prefix).
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class EgressRefused(Exception):
    """A tenant-chosen URL this server will not call. `reason` is for the operator's log only: responses to
    the tenant never say which host or address was refused, nor why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def host_pattern_valid(pattern: str) -> bool:
    """`*`, a host name or address, or `*.example.com` (any subdomain of example.com, not itself)."""
    if pattern == "*":
        return True
    name = pattern[2:] if pattern.startswith("*.") else pattern
    return bool(name) and "*" not in name and "/" not in name and " " not in name


@dataclass(frozen=True)
class EgressPolicy:
    hosts: tuple[str, ...]  # lower-case patterns, see host_pattern_valid
    private_networks: tuple[IPNetwork, ...]

    @classmethod
    def from_settings(cls) -> EgressPolicy:

        return _policy(
            tuple(settings.MNEMO_TENANT_LLM_HOSTS), tuple(settings.MNEMO_TENANT_LLM_PRIVATE_NETWORKS)
        )

    def host_allowed(self, host: str) -> bool:
        host = _normal_host(host)
        for pattern in self.hosts:
            if pattern == "*" or pattern == host:
                return True
            if pattern.startswith("*.") and host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
                return True
        return False

    def address_allowed(self, address: IPAddress) -> bool:
        if any(address in network for network in self.private_networks if network.version == address.version):
            return True
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return self.address_allowed(embedded)
        return address.is_global and not address.is_multicast

    def url_refusal(self, url: str) -> str | None:
        """Why the URL is refused before any connection (scheme, host not on the list), or None."""
        try:
            parts = urlsplit(url)
            host = parts.hostname
            parts.port  # noqa: B018 - raises ValueError on a malformed port
        except ValueError:
            return "malformed URL"
        if parts.scheme not in ("http", "https") or not host:
            return "not an http(s) URL with a host"
        if parts.username is not None or parts.password is not None:
            return "credentials in the URL"
        if not self.host_allowed(host):
            return f"host {host!r} is not in MNEMO_TENANT_LLM_HOSTS"
        return None

    def checked_addresses(self, host: str, port: int) -> list[str]:
        """Every address `host` resolves to, when all of them are allowed; raises EgressRefused otherwise."""
        if not self.host_allowed(host):
            raise EgressRefused(f"host {host!r} is not in MNEMO_TENANT_LLM_HOSTS")
        try:
            infos = resolve(_normal_host(host), port)
        except OSError as exc:
            raise EgressRefused(f"host {host!r} does not resolve ({exc})") from None
        addresses: list[str] = []
        for info in infos:
            raw = str(info[4][0]).split("%", 1)[0]  # an IPv6 scope id is not part of the address
            address = ipaddress.ip_address(raw)
            if not self.address_allowed(address):
                raise EgressRefused(
                    f"host {host!r} resolves to {address}, a private, loopback, link-local or reserved "
                    "address outside MNEMO_TENANT_LLM_PRIVATE_NETWORKS"
                )
            if raw not in addresses:
                addresses.append(raw)
        if not addresses:
            raise EgressRefused(f"host {host!r} resolves to no address")
        return addresses


@lru_cache(maxsize=8)
def _policy(hosts: tuple[str, ...], networks: tuple[str, ...]) -> EgressPolicy:
    return EgressPolicy(
        hosts=tuple(_normal_host(h) if h != "*" else h for h in hosts),
        private_networks=tuple(ipaddress.ip_network(n, strict=False) for n in networks),
    )


def _normal_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if address.version != 6:
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def resolve(host: str, port: int) -> list[Any]:
    """getaddrinfo, as one function the tests can replace."""
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


# --- the HTTP client ------------------------------------------------------------------------------------


def guarded_http_client(policy: EgressPolicy, *, timeout: float) -> httpx.Client:
    """An httpx client whose every connection goes through policy.checked_addresses: it connects to the
    addresses it checked (TLS still verifies the host name), takes no proxy from the environment (the
    check must see the address it connects to) and follows no redirects."""
    # Loaded on first use: the client package is heavy and most processes never call out.
    import httpcore
    import httpx

    transport = httpx.HTTPTransport()
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore.ConnectionPool) or not hasattr(pool, "_network_backend"):
        # httpx changed its internals: refuse rather than call a tenant URL unchecked.
        raise EgressRefused("cannot install the address check on this httpx version")
    pool._network_backend = _GuardedBackend(policy, pool._network_backend)  # type: ignore[assignment]  # duck-typed
    return httpx.Client(transport=transport, trust_env=False, follow_redirects=False, timeout=timeout)


class _GuardedBackend:
    """An httpcore network backend that resolves and checks the host itself, then connects to an address it
    checked."""

    def __init__(self, policy: EgressPolicy, inner: Any) -> None:
        self.policy = policy
        self.inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> Any:
        addresses = self.policy.checked_addresses(host, port)
        failure: Exception | None = None
        for address in addresses:  # as socket.create_connection would: the next address when one fails
            try:
                return self.inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except Exception as exc:
                failure = exc
        assert failure is not None  # checked_addresses never returns an empty list
        raise failure

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
        raise EgressRefused("unix sockets are not tenant endpoints")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


def guarded_async_http_client(policy: EgressPolicy, *, timeout: float) -> httpx.AsyncClient:
    """guarded_http_client for asyncio (the chat proxy streams from a tenant's endpoint): the same check,
    the host resolved on a worker thread so the event loop does not wait on DNS."""
    # Loaded on first use: the client package is heavy and most processes never call out.
    import httpcore
    import httpx

    transport = httpx.AsyncHTTPTransport()
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore.AsyncConnectionPool) or not hasattr(pool, "_network_backend"):
        raise EgressRefused("cannot install the address check on this httpx version")
    pool._network_backend = _AsyncGuardedBackend(policy, pool._network_backend)  # type: ignore[assignment]
    return httpx.AsyncClient(transport=transport, trust_env=False, follow_redirects=False, timeout=timeout)


class _AsyncGuardedBackend(_GuardedBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> Any:

        addresses = await asyncio.to_thread(self.policy.checked_addresses, host, port)
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self.inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except Exception as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
        raise EgressRefused("unix sockets are not tenant endpoints")

    async def sleep(self, seconds: float) -> None:  # type: ignore[override]
        await self.inner.sleep(seconds)
