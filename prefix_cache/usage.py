"""Provider usage objects, taken as the providers return them, and the providers' caching rules."""

from dataclasses import dataclass
from typing import Any

from rest_framework.exceptions import ErrorDetail, ValidationError

from tenants.errors import ApplicationError
from tenants.validation import INT32_MAX

PROVIDERS = ("openai", "anthropic", "gemini")

# OpenAI caches prompts of at least 1,024 tokens and reports hits in 128-token steps.
OPENAI_MIN_CACHEABLE = 1024
OPENAI_STEP = 128


@dataclass(frozen=True)
class ParsedUsage:
    provider: str
    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int | None
    completion_tokens: int | None


def openai_cacheable(prefix_tokens: int) -> int:
    if prefix_tokens < OPENAI_MIN_CACHEABLE:
        return 0
    return OPENAI_MIN_CACHEABLE + (prefix_tokens - OPENAI_MIN_CACHEABLE) // OPENAI_STEP * OPENAI_STEP


def anthropic_min_cacheable(model: str) -> int:
    # Anthropic's documented minimum cacheable prompt: 2,048 tokens for Haiku models, 1,024 for the others.
    return 2048 if "haiku" in model.lower() else 1024


def gemini_min_cacheable(model: str) -> int:
    # Gemini's implicit caching minimum: 4,096 tokens for Pro models, 1,024 for Flash and the others.
    return 4096 if "pro" in model.lower() else 1024


def cacheable_tokens(provider: str, *, prefix_tokens: int, model: str) -> int:
    """Tokens of a prefix the provider would read from its cache, by its own rule."""
    if provider == "openai":
        return openai_cacheable(prefix_tokens)
    if provider == "anthropic":
        return prefix_tokens if prefix_tokens >= anthropic_min_cacheable(model) else 0
    return prefix_tokens if prefix_tokens >= gemini_min_cacheable(model) else 0


def _bad(message: str) -> ApplicationError:
    return ApplicationError(message, code="invalid_usage")


def _too_many(*path: str) -> ValidationError:
    # The token columns are PositiveIntegerFields: a larger count would be a database error (500).
    detail: Any = [ErrorDetail(f"Ensure this value is less than or equal to {INT32_MAX}.", code="max_value")]
    for key in reversed(("usage", *path)):
        detail = {key: detail}
    return ValidationError(detail)


def _int(obj: dict[str, Any], *names: str, within: str = "") -> int | None:
    for name in names:
        if name in obj and obj[name] is not None:
            value = obj[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise _bad(f"{name} must be a non-negative integer.")
            if value > INT32_MAX:
                raise _too_many(*filter(None, (within, name)))
            return value
    return None


def _int_required(obj: dict[str, Any], *names: str) -> int:
    value = _int(obj, *names)
    if value is None:
        raise _bad(f"The usage object needs {names[0]}.")
    return value


def detect_provider(usage: dict[str, Any], *, default: str) -> str:
    if any(k in usage for k in ("promptTokenCount", "prompt_token_count", "cachedContentTokenCount")):
        return "gemini"
    if "prompt_tokens" in usage or "prompt_tokens_details" in usage or "input_tokens_details" in usage:
        return "openai"
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        return "anthropic"
    return default


def usage_parse(
    payload: Any, *, provider: str | None = None, default_provider: str = "openai"
) -> ParsedUsage:
    """Accepts the usage object itself or the whole response that carries it (`usage`, `usageMetadata`)."""
    if not isinstance(payload, dict):
        raise _bad("usage must be a JSON object.")
    usage = payload.get("usage") or payload.get("usageMetadata") or payload.get("usage_metadata") or payload
    if not isinstance(usage, dict):
        raise _bad("usage must be a JSON object.")
    if provider is not None and provider not in PROVIDERS:
        raise _bad(f"provider must be one of {', '.join(PROVIDERS)}.")
    provider = provider or detect_provider(usage, default=default_provider)

    if provider == "openai":
        # Chat Completions: prompt_tokens + prompt_tokens_details.cached_tokens;
        # Responses API: input_tokens + input_tokens_details.cached_tokens.
        prompt = _int_required(usage, "prompt_tokens", "input_tokens")
        details_name = "prompt_tokens_details"
        if not usage.get(details_name):
            details_name = "input_tokens_details"
        details = usage.get(details_name) or {}
        if not isinstance(details, dict):
            raise _bad("prompt_tokens_details must be an object.")
        cached = _int(details, "cached_tokens", within=details_name) or 0
        parsed = ParsedUsage(
            "openai", prompt, cached, None, _int(usage, "completion_tokens", "output_tokens")
        )
    elif provider == "anthropic":
        # input_tokens excludes what was read from or written to the cache; the prompt is all three.
        uncached = _int_required(usage, "input_tokens")
        read = _int(usage, "cache_read_input_tokens") or 0
        written = _int(usage, "cache_creation_input_tokens") or 0
        if uncached + read + written > INT32_MAX:  # the prompt is stored as their sum
            raise _too_many("input_tokens")
        parsed = ParsedUsage(
            "anthropic", uncached + read + written, read, written, _int(usage, "output_tokens")
        )
    else:
        prompt = _int_required(usage, "promptTokenCount", "prompt_token_count")
        cached = _int(usage, "cachedContentTokenCount", "cached_content_token_count") or 0
        parsed = ParsedUsage(
            "gemini", prompt, cached, None, _int(usage, "candidatesTokenCount", "candidates_token_count")
        )
    if parsed.cached_tokens > parsed.prompt_tokens:
        raise _bad("cached tokens cannot exceed prompt tokens.")
    return parsed
