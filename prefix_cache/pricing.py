"""Input-token prices (USD per million tokens) used to value cache hits. List prices at the time of
writing; override or extend with MNEMO_PRICE_TABLE (JSON: {"model-prefix": {"input", "cached_input",
"cache_write"}}). A model is priced by the longest matching prefix."""

from django.conf import settings

from providers.model_table import normalize_model_name

DEFAULT_PRICES: dict[str, dict[str, float]] = {
    "gpt-4o": {"input": 2.50, "cached_input": 1.25},
    "gpt-4o-mini": {"input": 0.15, "cached_input": 0.075},
    "gpt-4.1": {"input": 2.00, "cached_input": 0.50},
    "gpt-4.1-mini": {"input": 0.40, "cached_input": 0.10},
    "gpt-4.1-nano": {"input": 0.10, "cached_input": 0.025},
    "o3": {"input": 2.00, "cached_input": 0.50},
    "o4-mini": {"input": 1.10, "cached_input": 0.275},
    "claude-sonnet-4": {"input": 3.00, "cached_input": 0.30, "cache_write": 3.75},
    "claude-3-7-sonnet": {"input": 3.00, "cached_input": 0.30, "cache_write": 3.75},
    "claude-3-5-sonnet": {"input": 3.00, "cached_input": 0.30, "cache_write": 3.75},
    "claude-opus-4": {"input": 15.00, "cached_input": 1.50, "cache_write": 18.75},
    "claude-3-5-haiku": {"input": 0.80, "cached_input": 0.08, "cache_write": 1.00},
    "gemini-2.5-pro": {"input": 1.25, "cached_input": 0.31},
    "gemini-2.5-flash": {"input": 0.30, "cached_input": 0.075},
    "gemini-2.0-flash": {"input": 0.10, "cached_input": 0.025},
}


def price_for(model: str) -> dict[str, float] | None:
    table = {**DEFAULT_PRICES, **getattr(settings, "MNEMO_PRICE_TABLE", {})}
    name = normalize_model_name(model)
    best = None
    for prefix in table:
        if (name == prefix or name.startswith(prefix + "-")) and (best is None or len(prefix) > len(best)):
            best = prefix
    return table[best] if best else None


def savings_usd(*, model: str, cached_tokens: int, cache_write_tokens: int) -> float | None:
    """What the cache saved: cached tokens at the uncached price minus their cached price, less the
    surcharge for writing the cache where the provider charges one."""
    price = price_for(model)
    if price is None:
        return None
    saved = cached_tokens * (price["input"] - price.get("cached_input", price["input"]))
    surcharge = cache_write_tokens * (price.get("cache_write", price["input"]) - price["input"])
    return (saved - surcharge) / 1_000_000
