"""Reads for tenants and API keys."""

import hmac

from django.conf import settings
from django.core.cache import cache, caches
from django.core.cache.backends.db import DatabaseCache
from django.core.cache.backends.filebased import FileBasedCache
from django.core.cache.backends.memcached import BaseMemcachedCache
from django.core.cache.backends.redis import RedisCache
from django_redis.cache import RedisCache as DjangoRedisCache

from tenants.models import ApiKey, hash_api_key, split_api_key

# A revocation drops the cached key only from the cache of the process that made it (tenants/receivers.py).
# Where each process caches in its own memory (no REDIS_URL: several server workers, or a revocation made
# from `manage.py shell` or the admin of another process), the others would go on serving their copy; there
# a key is trusted from the cache this long at most, which bounds how late a revocation reaches them.
PROCESS_CACHE_KEY_SECONDS = 5
# Backends every process reads alike, so dropping an entry reaches them all.
_SHARED_CACHES = (RedisCache, DjangoRedisCache, BaseMemcachedCache, DatabaseCache, FileBasedCache)


def api_key_cache_key(prefix: str) -> str:
    return f"mnemo:apikey:{prefix}"


def api_key_cache_shared() -> bool:
    return isinstance(caches["default"], _SHARED_CACHES)


def api_key_cache_seconds() -> int:
    """How long a resolved key is served from the cache: MNEMO_API_KEY_CACHE_SECONDS in a cache shared by
    every process, at most PROCESS_CACHE_KEY_SECONDS in one that lives in each process's memory (0: off)."""
    seconds = settings.MNEMO_API_KEY_CACHE_SECONDS
    return seconds if api_key_cache_shared() else min(seconds, PROCESS_CACHE_KEY_SECONDS)


def api_key_resolve(*, raw_key: str) -> ApiKey | None:
    """The active key matching raw_key (with its tenant loaded), or None.

    Every request authenticates, so the key row (with its tenant) is cached by its lookup prefix
    (api_key_cache_seconds); revoking a key or saving it or its tenant drops the entry (tenants/receivers.py),
    so with a shared cache a revocation takes effect at once, and with a cache of each process's own within
    PROCESS_CACHE_KEY_SECONDS."""
    lookup = split_api_key(raw_key)
    if lookup is None:
        return None
    cache_key = api_key_cache_key(lookup)
    seconds = api_key_cache_seconds()
    key = cache.get(cache_key) if seconds else None
    if key is None:
        key = ApiKey.objects.active().select_related("tenant").filter(prefix=lookup).first()
        if key is None:
            return None
        if seconds:
            cache.set(cache_key, key, seconds)
    if not hmac.compare_digest(key.hashed_key, hash_api_key(raw_key)):
        return None
    return key
