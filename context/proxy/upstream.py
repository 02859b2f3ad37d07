"""The upstream call: the OpenAI format through the `openai` package's async client, the Anthropic format
over plain httpx. Which endpoint and key follow providers/llm.py's rules (a tenant's own URL gets only the
tenant's key and is called only as providers/egress.py allows); every failure becomes a ProxyError with the
status the client's SDK expects, and nothing of the key or the URL reaches the client or the log."""

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from context.proxy.errors import ProxyError
from providers.egress import EgressPolicy, EgressRefused, guarded_async_http_client
from providers.llm import LLMConfig, _request_headers, llm_config

logger = logging.getLogger(__name__)

ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True)
class Upstream:
    fmt: str
    base_url: str | None
    api_key: str
    tenant_endpoint: bool

    def label(self) -> str:
        """For the operator's log: the host, never the key."""

        host = urlsplit(self.base_url).hostname if self.base_url else "api.openai.com"
        return f"{self.fmt} upstream at {host} ({'tenant' if self.tenant_endpoint else 'platform'})"


def _not_configured(fmt: str) -> ProxyError:
    return ProxyError(
        f"No {fmt} upstream is configured for this tenant.", code="upstream_not_configured", status=503
    )


def upstream_for(*, fmt: str, tenant_settings: dict[str, Any]) -> Upstream:
    if fmt == "openai":
        config = llm_config({**tenant_settings, "llm_enabled": True})
        if config is None:
            raise _not_configured(fmt)
        return Upstream(fmt, config.base_url, config.api_key, config.tenant_endpoint)
    tenant_url = str(tenant_settings.get("anthropic_base_url") or "").strip()
    tenant_key = str(tenant_settings.get("anthropic_api_key") or "").strip()
    if tenant_url:  # the platform's key never goes to a tenant's URL
        return Upstream(fmt, tenant_url, tenant_key, tenant_endpoint=True)
    key = tenant_key or str(settings.ANTHROPIC_API_KEY or "").strip()
    base = str(settings.ANTHROPIC_BASE_URL or "").strip()
    if not base or (not key and "api.anthropic.com" in base):
        raise _not_configured(fmt)
    return Upstream(fmt, base, key, tenant_endpoint=False)


def _refused(upstream: Upstream, reason: str) -> ProxyError:
    logger.warning("proxy call to %s refused: %s", upstream.label(), reason)
    return ProxyError(
        "This server does not call the tenant's endpoint (its host is not on the operator's allow-list, "
        "or it is not a public address).",
        code="upstream_refused",
        status=502,
    )


@functools.lru_cache(maxsize=64)
def _http_client(loop: Any, tenant_endpoint: bool, timeout: float) -> Any:
    """One connection pool per event loop (and per kind of endpoint): a pool cannot move between loops."""
    # Loaded on first use: the client package is heavy and most processes never call out.
    import httpx

    if tenant_endpoint:
        return guarded_async_http_client(EgressPolicy.from_settings(), timeout=timeout)
    return httpx.AsyncClient(timeout=timeout, follow_redirects=False)


def http_client(upstream: Upstream) -> Any:
    if upstream.tenant_endpoint:
        reason = EgressPolicy.from_settings().url_refusal(upstream.base_url or "")
        if reason is not None:
            raise _refused(upstream, reason)
    try:
        return _http_client(
            asyncio.get_running_loop(), upstream.tenant_endpoint, float(settings.MNEMO_PROXY_DEADLINE_SECONDS)
        )
    except EgressRefused as exc:
        raise _refused(upstream, exc.reason) from None


def _scrub(text: str, upstream: Upstream) -> str:
    for secret in (upstream.api_key, upstream.base_url):
        if secret:
            text = text.replace(secret, "[redacted]")
    return text[:2000]


def _upstream_message(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str):
            return message
        if isinstance(error, str):
            return error
    return ""


def status_error(upstream: Upstream, status: int, body: Any, headers: Any) -> ProxyError:
    """An upstream error status as the client's: 429 keeps its retry-after, 5xx and 4xx keep their status,
    and the upstream refusing our key is a 502 (the client's own key was fine)."""
    logger.warning("proxy call to %s answered %s", upstream.label(), status)
    detail = _scrub(_upstream_message(body), upstream)
    if status in (401, 403):
        return ProxyError("The upstream refused this server's credentials.", code="upstream_auth", status=502)
    if status == 429:
        retry = headers.get("retry-after") if headers is not None else None
        return ProxyError(
            detail or "The upstream is rate limiting; retry later.",
            code="upstream_rate_limited",
            status=429,
            headers={"retry-after": str(retry or 1)},
        )
    code = "upstream_error" if status >= 500 else "upstream_rejected"
    return ProxyError(detail or f"The upstream answered {status}.", code=code, status=status)


def timeout_error(upstream: Upstream) -> ProxyError:
    logger.warning("proxy call to %s passed the deadline", upstream.label())
    return ProxyError(
        f"The upstream did not answer within {settings.MNEMO_PROXY_DEADLINE_SECONDS} s.",
        code="upstream_timeout",
        status=504,
    )


def unreachable_error(upstream: Upstream, exc: BaseException) -> ProxyError:
    logger.warning("proxy call to %s failed: %s", upstream.label(), type(exc).__name__)
    return ProxyError("The upstream could not be reached.", code="upstream_unreachable", status=502)


# --- the reply as it arrives --------------------------------------------------------------------------------


@dataclass
class Reply:
    """What the upstream said, gathered from a whole reply or from stream events."""

    texts: dict[int, str] = field(default_factory=dict)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    finish: str | None = None

    @property
    def text(self) -> str:
        return "\n".join(self.texts[i] for i in sorted(self.texts))

    def item(self, fmt: str) -> dict[str, Any]:
        """The assistant message as Mnemo stores it (and as the client will send it back)."""
        parts = []
        for index in sorted(self.calls):
            call = self.calls[index]
            arguments: Any = call.get("arguments", "")
            if fmt == "anthropic":
                try:
                    arguments = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
                except ValueError:
                    arguments = {"raw": arguments}
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id", ""),
                    "name": call.get("name", ""),
                    "arguments": arguments,
                }
            )
        return {"role": "assistant", "content": self.text, "parts": parts}

    def add_openai_chunk(self, chunk: dict[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or choice.get("message") or {}
            if isinstance(delta.get("content"), str):
                self.texts[0] = self.texts.get(0, "") + delta["content"]
            for position, call in enumerate(delta.get("tool_calls") or []):
                slot = self.calls.setdefault(call.get("index", position), {"arguments": ""})
                if call.get("id"):
                    slot["id"] = call["id"]
                function = call.get("function") or {}
                if function.get("name"):
                    slot["name"] = function["name"]
                slot["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]

    def add_anthropic_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self.usage = dict((event.get("message") or {}).get("usage") or {})
        elif kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "text":
                self.texts[event.get("index", 0)] = block.get("text", "")
            elif block.get("type") == "tool_use":
                self.calls[event.get("index", 0)] = {
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "arguments": "",
                }
        elif kind == "content_block_delta":
            index, delta = event.get("index", 0), event.get("delta") or {}
            if delta.get("type") == "text_delta":
                self.texts[index] = self.texts.get(index, "") + delta.get("text", "")
            elif delta.get("type") == "input_json_delta" and index in self.calls:
                self.calls[index]["arguments"] += delta.get("partial_json", "")
        elif kind == "message_delta":
            self.usage = {**(self.usage or {}), **(event.get("usage") or {})}
            self.finish = (event.get("delta") or {}).get("stop_reason") or self.finish

    def add_anthropic_message(self, message: dict[str, Any]) -> None:
        for index, block in enumerate(message.get("content") or []):
            if block.get("type") == "text":
                self.texts[index] = block.get("text", "")
            elif block.get("type") == "tool_use":
                self.calls[index] = {
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "arguments": json.dumps(block.get("input") or {}),
                }
        self.usage = message.get("usage")
        self.finish = message.get("stop_reason")


# --- calls ------------------------------------------------------------------------------------------------


def _url(upstream: Upstream, path: str) -> str:
    base = (upstream.base_url or "https://api.openai.com/v1").rstrip("/")
    if upstream.fmt == "anthropic" and not base.endswith("/v1"):
        base += "/v1"  # Anthropic's base URL names the host; OpenAI-compatible ones include /v1
    return base + path


def _headers(upstream: Upstream) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if upstream.fmt == "anthropic":
        headers["anthropic-version"] = ANTHROPIC_VERSION
        if upstream.api_key:
            headers["x-api-key"] = upstream.api_key
    elif upstream.api_key:
        headers["authorization"] = f"Bearer {upstream.api_key}"
    return headers


@dataclass
class Opened:
    """A stream whose status was good: its events follow."""

    response: Any
    events: AsyncIterator[tuple[str | None, str]]


async def _error_of(upstream: Upstream, response: Any) -> ProxyError:
    raw = await response.aread()
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    return status_error(upstream, response.status_code, body, response.headers)


async def _sse(response: Any) -> AsyncIterator[tuple[str | None, str]]:
    """(event name, data) of each server-sent event, as it arrives."""
    event: str | None = None
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = None, []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
    if data:
        yield event, "\n".join(data)


_openai_clients: dict[tuple[Any, ...], Any] = {}


def client_package_load() -> None:
    """Import the `openai` package and the chat resources its client loads on first use (seconds of a
    process's GIL): a server calls it while it warms up, before any request (config.startup), where the first
    proxied call would otherwise pay for it while the process serves others."""
    import openai.resources.chat  # noqa: F401


def _openai_client(
    loop: Any, base_url: str | None, api_key: str, tenant_endpoint: bool, timeout: float
) -> Any:
    # Loaded on first use: the client package is heavy and most processes never call out.
    import openai

    client = openai.AsyncOpenAI(
        base_url=base_url,
        api_key=api_key or "not-needed",
        max_retries=0,  # the client's SDK retries; a proxy that retried too would multiply them
        timeout=timeout,
        http_client=_http_client(loop, tenant_endpoint, timeout),
    )
    return client.chat.completions.with_raw_response


async def _openai_completions(upstream: Upstream) -> Any:
    """The package's chat completions (raw responses) for this endpoint and loop. Built on a worker thread
    the first time: importing `openai` and its chat resources takes seconds, which the event loop, serving
    every other stream meanwhile, must not spend."""
    loop = asyncio.get_running_loop()
    key = (
        loop,
        upstream.base_url,
        upstream.api_key,
        upstream.tenant_endpoint,
        float(settings.MNEMO_PROXY_DEADLINE_SECONDS),
    )
    completions = _openai_clients.get(key)
    if completions is None:
        completions = await asyncio.to_thread(_openai_client, *key)
        if len(_openai_clients) > 64:
            _openai_clients.clear()
        _openai_clients[key] = completions
    return completions


async def _openai_send(upstream: Upstream, body: dict[str, Any]) -> Any:
    """The request through the `openai` package; its raw HTTP response (read as a stream or whole)."""
    http_client(upstream)  # the egress check
    completions = await _openai_completions(upstream)
    # Imported by then, on the worker thread that built the client: importing it here, on the event loop,
    # stalled every request of the process for as long as the import took.
    import openai

    headers = _request_headers(_llm_view(upstream))
    try:
        # The body is in the wire format already. As extra_body the package sends it as it is; as arguments
        # it would walk every message through its parameter transform, slow on long histories.
        raw = await completions.create(
            model=body["model"],
            messages=[],
            stream=bool(body.get("stream")),
            extra_body={k: v for k, v in body.items() if k not in ("model", "stream")},
            extra_headers=headers,
        )
    except openai.APITimeoutError:
        raise timeout_error(upstream) from None
    except openai.APIConnectionError as exc:
        raise _connect_error(upstream, exc) from None
    except openai.APIStatusError as exc:
        error = {"error": exc.body} if exc.body else None
        raise status_error(upstream, exc.status_code, error, exc.response.headers) from None
    return raw.http_response


def _llm_view(upstream: Upstream) -> Any:

    return LLMConfig(
        base_url=upstream.base_url,
        api_key=upstream.api_key,
        model="",
        timeout=0,
        max_retries=0,
        backoff=0,
        tenant_endpoint=upstream.tenant_endpoint,
    )


async def _httpx_send(upstream: Upstream, body: dict[str, Any], *, stream: bool) -> Any:
    # Loaded on first use: the client package is heavy and most processes never call out.
    import httpx

    client = http_client(upstream)
    request = client.build_request("POST", _url(upstream, "/messages"), json=body, headers=_headers(upstream))
    try:
        response = await client.send(request, stream=stream)
    except httpx.TimeoutException:
        raise timeout_error(upstream) from None
    except (httpx.HTTPError, EgressRefused, OSError) as exc:
        raise _connect_error(upstream, exc) from None
    if response.status_code >= 400:
        try:
            raise await _error_of(upstream, response)
        finally:
            await response.aclose()
    return response


async def post(upstream: Upstream, body: dict[str, Any]) -> Any:
    """A whole reply: the upstream's JSON body as it sent it, or a ProxyError."""
    if upstream.fmt == "anthropic":
        response = await _httpx_send(upstream, body, stream=False)
    else:
        response = await _openai_send(upstream, body)
        await response.aread()
    try:
        return response.json()
    except ValueError:
        raise ProxyError("The upstream's reply is not JSON.", code="upstream_bad_reply", status=502) from None


def _connect_error(upstream: Upstream, exc: BaseException) -> ProxyError:
    refusal: BaseException | None = exc
    while refusal is not None and not isinstance(refusal, EgressRefused):
        refusal = refusal.__cause__ or refusal.__context__
    if isinstance(refusal, EgressRefused):
        return _refused(upstream, refusal.reason)
    return unreachable_error(upstream, exc)


async def open_stream(upstream: Upstream, body: dict[str, Any]) -> Opened:
    """Send the request and wait for the status, so a refusal (429, 500) is still an HTTP error status for
    the client; the events are read as the client reads them."""
    if upstream.fmt == "anthropic":
        response = await _httpx_send(upstream, body, stream=True)
    else:
        response = await _openai_send(upstream, body)
    return Opened(response=response, events=_sse(response))
