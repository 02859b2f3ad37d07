"""Reads for tenants and API keys."""

import hmac

from django.conf import settings
from django.core.cache import cache

from tenants.models import ApiKey, hash_api_key, split_api_key


def api_key_cache_key(prefix: str) -> str:
    return f"mnemo:apikey:{prefix}"


def api_key_resolve(*, raw_key: str) -> ApiKey | None:
    """The active key matching raw_key (with its tenant loaded), or None.

    Every request authenticates, so the key row (with its tenant) is cached by its lookup prefix for
    MNEMO_API_KEY_CACHE_SECONDS in the shared cache; revoking a key or saving it or its tenant drops the
    entry (tenants/receivers.py), so a revocation takes effect at once."""
    lookup = split_api_key(raw_key)
    if lookup is None:
        return None
    cache_key = api_key_cache_key(lookup)
    key = cache.get(cache_key) if settings.MNEMO_API_KEY_CACHE_SECONDS else None
    if key is None:
        key = ApiKey.objects.active().select_related("tenant").filter(prefix=lookup).first()
        if key is None:
            return None
        if settings.MNEMO_API_KEY_CACHE_SECONDS:
            cache.set(cache_key, key, settings.MNEMO_API_KEY_CACHE_SECONDS)
    if not hmac.compare_digest(key.hashed_key, hash_api_key(raw_key)):
        return None
    return key
