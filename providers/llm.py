"""The LLM client: any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, a gateway) through the `openai`
package. Timeouts and retries with backoff are ours, and every failure comes back as one of our LLMError
types, so callers fall back on a code, never on a third-party exception class."""

from __future__ import annotations

import functools
import json
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypedDict
from urllib.parse import urlsplit

from django.conf import settings

from providers.egress import EgressPolicy, EgressRefused, guarded_http_client
from providers.tokens import count_chat, count_text

logger = logging.getLogger(__name__)

# The model used when an endpoint is configured but no model is named (OpenAI's small chat model).
FALLBACK_MODEL = "gpt-4o-mini"
# Ollama and vLLM accept any key; the openai package refuses to start without one.
_PLACEHOLDER_KEY = "not-needed"


class LLMError(Exception):
    """A model call that did not produce a usable reply. `code` is stable and safe to show a client."""

    code = "llm_error"
    retryable = False

    def __init__(self, message: str, *, attempts: int = 1, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.attempts = attempts
        self.status = status


class LLMNotConfigured(LLMError):
    code = "llm_not_configured"


class LLMTimeout(LLMError):
    code = "llm_timeout"
    retryable = True


class LLMUnavailable(LLMError):
    """Connection refused, 429 or 5xx: worth trying again later."""

    code = "llm_unavailable"
    retryable = True


class LLMRejected(LLMError):
    """4xx other than 429: bad key, unknown model, request too large. Retrying will not help."""

    code = "llm_rejected"


class LLMBadResponse(LLMError):
    """The endpoint answered 200 with something that is not a chat completion."""

    code = "llm_bad_response"


class LLMEndpointRefused(LLMError):
    """A tenant's own endpoint this server will not call (providers/egress.py). The message is the same
    whatever the reason, and names no URL or address: the operator's log has the details."""

    code = "llm_endpoint_refused"

    def __init__(self, *, attempts: int = 1) -> None:
        super().__init__(
            "this server does not call the tenant's LLM endpoint (its host is not on the operator's "
            "allow-list, or it is not a public address)",
            attempts=attempts,
        )


@dataclass(frozen=True)
class LLMConfig:
    base_url: str | None
    api_key: str
    model: str
    timeout: float
    max_retries: int
    backoff: float
    # A URL from the tenant's settings: called only as providers/egress.py allows, never with the platform's
    # key.
    tenant_endpoint: bool = False

    def with_limits(self, *, timeout: float | None = None, max_retries: int | None = None) -> LLMConfig:
        """The same endpoint with tighter limits (the request path cannot wait as long as a worker)."""
        return replace(
            self,
            timeout=self.timeout if timeout is None else min(self.timeout, timeout),
            max_retries=self.max_retries if max_retries is None else min(self.max_retries, max_retries),
        )

    def describe(self) -> str:
        """Model and whose endpoint, for responses: no key, and no URL either (the platform's endpoint may
        be an internal address; a tenant's may be one this server refused to call)."""
        return f"{self.model} at the {'tenant' if self.tenant_endpoint else 'platform'}'s endpoint"

    def log_label(self) -> str:
        """Model and endpoint host, for the operator's log."""

        host = urlsplit(self.base_url).hostname if self.base_url else "api.openai.com"
        return f"{self.model} at {host} ({'tenant' if self.tenant_endpoint else 'platform'})"


def llm_config(overrides: Mapping[str, Any] | None = None) -> LLMConfig | None:
    """The endpoint from settings (LLM_BASE_URL, LLM_API_KEY, LLM_MODEL), with a tenant's own
    `llm_base_url`, `llm_api_key` and `llm_model` settings taking precedence. None when neither names an
    endpoint: the caller then uses the offline path.

    A tenant's `llm_base_url` comes with the tenant's `llm_api_key` or with no key at all: the platform's
    LLM_API_KEY only ever goes to the platform's endpoint. Whether the tenant's URL is called at all is
    decided when the call is made (providers/egress.py, MNEMO_TENANT_LLM_HOSTS)."""

    overrides = overrides or {}
    if overrides.get("llm_enabled") is False:
        return None
    model = str(overrides.get("llm_model") or settings.LLM_MODEL or "").strip() or FALLBACK_MODEL
    limits = _Limits(
        timeout=float(settings.LLM_TIMEOUT_SECONDS),
        max_retries=int(settings.LLM_MAX_RETRIES),
        backoff=float(settings.LLM_RETRY_BACKOFF_SECONDS),
    )
    tenant_key = str(overrides.get("llm_api_key") or "").strip()
    tenant_url = str(overrides.get("llm_base_url") or "").strip()
    if tenant_url:
        return LLMConfig(base_url=tenant_url, api_key=tenant_key, model=model, tenant_endpoint=True, **limits)
    base_url = str(settings.LLM_BASE_URL or "").strip() or None
    api_key = tenant_key or str(settings.LLM_API_KEY or "").strip()
    if not base_url and not api_key:
        return None
    return LLMConfig(base_url=base_url, api_key=api_key or _PLACEHOLDER_KEY, model=model, **limits)


class _Limits(TypedDict):
    timeout: float
    max_retries: int
    backoff: float


@dataclass(frozen=True)
class ToolCall:
    """One function call the model asked for. `arguments` is the JSON text as the model wrote it: parsing and
    validating it is the caller's job (a model may send broken JSON or hallucinate parameters)."""

    id: str
    name: str
    arguments: str

    def message_data(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class LLMReply:
    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    # False when the endpoint sent no usage and the counts are our own tiktoken estimate.
    usage_reported: bool
    attempts: int
    elapsed_ms: float
    # Only chat_tools() fills these; chat() keeps the text-only contract.
    tool_calls: tuple[ToolCall, ...] = ()

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def assistant_message(self) -> dict[str, Any]:
        """The reply as the assistant message the next request of a tool loop must repeat."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.tool_calls:
            message["tool_calls"] = [call.message_data() for call in self.tool_calls]
        return message


@functools.lru_cache(maxsize=32)
def _client(base_url: str | None, api_key: str, timeout: float, egress: EgressPolicy | None = None) -> Any:
    # Loaded on first use: the client package is heavy and most processes never call out.
    import openai

    options: dict[str, Any] = {}
    if egress is not None:
        # A tenant's endpoint: every connection checked (providers/egress.py).
        options["http_client"] = guarded_http_client(egress, timeout=timeout)
    # Retries are ours (counted, logged, with our backoff), so the package's own are off. Without a key the
    # package still wants one: it gets a placeholder that _request_headers keeps off the wire.
    return openai.OpenAI(
        base_url=base_url, api_key=api_key or _PLACEHOLDER_KEY, timeout=timeout, max_retries=0, **options
    )


def _request_headers(config: LLMConfig) -> dict[str, Any]:
    # Loaded on first use: the client package is heavy and most processes never call out.
    import openai

    headers: dict[str, Any] = {}
    if config.tenant_endpoint:
        # Nothing of the platform's OpenAI environment (OPENAI_ORG_ID, OPENAI_PROJECT_ID) goes to a tenant.
        headers = {"OpenAI-Organization": openai.Omit(), "OpenAI-Project": openai.Omit()}
    if not config.api_key:
        headers["Authorization"] = openai.Omit()  # no key: no Authorization header at all
    return headers


def _refusal(exc: BaseException | None) -> EgressRefused | None:
    """The egress refusal behind an exception (the openai package wraps it in APIConnectionError)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, EgressRefused):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _classify(exc: Exception, attempt: int) -> LLMError:
    # Loaded on first use: the client package is heavy and most processes never call out.
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return LLMTimeout(f"no reply within the timeout: {exc}", attempts=attempt)
    if isinstance(exc, openai.APIConnectionError):
        return LLMUnavailable(f"cannot reach the endpoint: {exc}", attempts=attempt)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status == 429 or status >= 500:
            return LLMUnavailable(f"the endpoint answered {status}", attempts=attempt, status=status)
        return LLMRejected(
            f"the endpoint refused the request ({status}): {exc.message}", attempts=attempt, status=status
        )
    if isinstance(exc, openai.APIResponseValidationError | ValueError | json.JSONDecodeError):
        return LLMBadResponse(f"the reply is not a chat completion: {exc}", attempts=attempt)
    return LLMError(f"{type(exc).__name__}: {exc}", attempts=attempt)


def _first_message(completion: Any, attempt: int) -> Any:
    choices = getattr(completion, "choices", None)
    if not choices:
        raise LLMBadResponse("the reply has no choices", attempts=attempt)
    return getattr(choices[0], "message", None)


def _reply_text(completion: Any, attempt: int) -> str:
    text = getattr(_first_message(completion, attempt), "content", None)
    if not isinstance(text, str) or not text.strip():
        raise LLMBadResponse("the reply has no text content", attempts=attempt)
    return text.strip()


def _reply_tool_calls(completion: Any, attempt: int) -> tuple[str, tuple[ToolCall, ...]]:
    """The text (possibly empty) and the function calls of a reply. A reply with neither is a valid "nothing
    to do". Malformed calls are kept with what they have (an empty name, arguments as sent) so the caller can
    report them back to the model instead of losing them."""
    message = _first_message(completion, attempt)
    if message is None:
        raise LLMBadResponse("the reply has no message", attempts=attempt)
    text = getattr(message, "content", None)
    raw_calls = getattr(message, "tool_calls", None) or []
    if not isinstance(raw_calls, list | tuple):
        raise LLMBadResponse("the reply's tool_calls is not a list", attempts=attempt)
    calls = []
    for index, raw in enumerate(raw_calls):
        function = getattr(raw, "function", None)
        if function is None and isinstance(raw, Mapping):  # a gateway that sent something the SDK left raw
            function = raw.get("function")
        name = getattr(function, "name", None) if not isinstance(function, Mapping) else function.get("name")
        arguments = (
            getattr(function, "arguments", None)
            if not isinstance(function, Mapping)
            else function.get("arguments")
        )
        if not isinstance(arguments, str):
            # Some Ollama versions send the arguments as an object rather than JSON text.
            arguments = json.dumps(arguments) if isinstance(arguments, dict) else ""
        call_id = getattr(raw, "id", None) or (raw.get("id") if isinstance(raw, Mapping) else None)
        calls.append(ToolCall(id=str(call_id or f"call_{index}"), name=str(name or ""), arguments=arguments))
    return (text.strip() if isinstance(text, str) else ""), tuple(calls)


def _usage(
    completion: Any, messages: Sequence[Mapping[str, Any]], text: str, model: str
) -> tuple[int, int, bool]:
    usage = getattr(completion, "usage", None)
    prompt = getattr(usage, "prompt_tokens", None)
    completion_tokens = getattr(usage, "completion_tokens", None)
    if isinstance(prompt, int) and isinstance(completion_tokens, int):
        return prompt, completion_tokens, True
    # No usage in the reply (some gateways omit it): count it ourselves so the budget still moves.

    return count_chat(list(messages), model=model), count_text(text, model=model), False


def _complete(
    config: LLMConfig | None,
    messages: Sequence[Mapping[str, Any]],
    *,
    parse: Callable[[Any, int], tuple[str, tuple[ToolCall, ...]]],
    sleep: Callable[[float], None],
    **request: Any,
) -> LLMReply:
    """The retry loop both calls share: exponential backoff (with jitter) on timeouts, connection errors,
    429 and 5xx; a 4xx or a malformed reply fails at once."""
    if config is None:
        raise LLMNotConfigured("no LLM endpoint is configured")
    client = _egress_client(config)
    headers = _request_headers(config)
    started = time.perf_counter()
    attempts = 1 + max(0, config.max_retries)
    for attempt in range(1, attempts + 1):
        try:
            completion = client.chat.completions.create(
                model=config.model, messages=list(messages), extra_headers=headers, **request
            )
            if isinstance(completion, str):  # a non-JSON content type comes back as the raw text
                raise LLMBadResponse("the reply is not JSON", attempts=attempt)
            return _reply(completion, config, messages, parse=parse, attempt=attempt, started=started)
        except LLMError:
            raise
        except Exception as exc:
            sleep(_retry_delay(exc, config, attempt=attempt, attempts=attempts))
    raise AssertionError("unreachable")  # pragma: no cover


def _egress_client(config: LLMConfig) -> Any:
    """The OpenAI client for `config`; a tenant's own endpoint goes through the egress policy, and one it
    refuses raises LLMEndpointRefused."""
    egress = None
    if config.tenant_endpoint:
        egress = EgressPolicy.from_settings()
        reason = egress.url_refusal(config.base_url or "")
        if reason is not None:
            logger.warning("LLM call to %s refused: %s", config.log_label(), reason)
            raise LLMEndpointRefused()
    try:
        return _client(config.base_url, config.api_key, config.timeout, egress)
    except EgressRefused as exc:
        logger.warning("LLM call to %s refused: %s", config.log_label(), exc.reason)
        raise LLMEndpointRefused() from None


def _reply(
    completion: Any,
    config: LLMConfig,
    messages: Sequence[Mapping[str, Any]],
    *,
    parse: Callable[[Any, int], tuple[str, tuple[ToolCall, ...]]],
    attempt: int,
    started: float,
) -> LLMReply:
    text, tool_calls = parse(completion, attempt)
    counted = text + "".join(call.name + call.arguments for call in tool_calls)
    prompt_tokens, completion_tokens, reported = _usage(completion, messages, counted, config.model)
    return LLMReply(
        text=text,
        model=str(getattr(completion, "model", None) or config.model),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        usage_reported=reported,
        attempts=attempt,
        elapsed_ms=round((time.perf_counter() - started) * 1000, 1),
        tool_calls=tool_calls,
    )


def _retry_delay(exc: Exception, config: LLMConfig, *, attempt: int, attempts: int) -> float:
    """How long to wait before retrying after `exc`; raises the LLMError it stands for when it is not worth
    retrying or this was the last attempt."""
    refusal = _refusal(exc)
    if refusal is not None:
        logger.warning("LLM call to %s refused: %s", config.log_label(), refusal.reason)
        raise LLMEndpointRefused(attempts=attempt) from None
    error = _classify(exc, attempt)
    if not error.retryable or attempt == attempts:
        logger.warning("LLM call to %s failed after %d attempt(s): %s", config.log_label(), attempt, error)
        raise error from exc
    delay = config.backoff * (2 ** (attempt - 1)) * random.uniform(0.8, 1.2)  # noqa: S311
    logger.info(
        "LLM call to %s failed (%s); retry %d in %.2fs",
        config.log_label(),
        error.code,
        attempt,
        delay,
    )
    return delay


def chat(
    config: LLMConfig | None,
    messages: Sequence[Mapping[str, str]],
    *,
    max_tokens: int,
    temperature: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> LLMReply:
    """One chat completion, retried with exponential backoff (with jitter) on timeouts, connection errors,
    429 and 5xx; a 4xx or a malformed reply fails at once. Raises an LLMError subclass."""
    return _complete(
        config,
        messages,
        parse=lambda completion, attempt: (_reply_text(completion, attempt), ()),
        sleep=sleep,
        max_tokens=max_tokens,
        temperature=temperature,
    )


def chat_tools(
    config: LLMConfig | None,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]],
    max_tokens: int,
    temperature: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> LLMReply:
    """One chat completion that may call the given OpenAI function tools (`tool_choice` auto). The reply's
    `tool_calls` are returned unexecuted and unvalidated; `text` may be empty. Same retries, timeouts and
    errors as chat(). `messages` may hold the assistant tool-call messages and `tool` results of earlier
    rounds (LLMReply.assistant_message() gives the former)."""
    return _complete(
        config,
        messages,
        parse=_reply_tool_calls,
        sleep=sleep,
        tools=list(tools),
        tool_choice="auto",
        max_tokens=max_tokens,
        temperature=temperature,
    )
