"""The Redis cache backend (CACHES when REDIS_URL is set): django-redis with its errors ignored, so a cache
that does not answer is a miss and a skipped write, never a request error; each ignored error is recorded as
a service fault (providers.faults: logged, counted, listed in the context response)."""

import sys
from typing import Any

from django_redis.cache import RedisCache as DjangoRedisCache

from providers.faults import CACHE_UNAVAILABLE, service_fault


class _FaultLog:
    """Stands in for django-redis's logger: it calls .exception() inside the except block that ignored an
    error (django_redis.cache.omit_exception)."""

    def exception(self, *args: Any, **kwargs: Any) -> None:
        exc = sys.exc_info()[1]
        service_fault(CACHE_UNAVAILABLE, getattr(exc, "__cause__", None) or exc)


class RedisCache(DjangoRedisCache):
    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._ignore_exceptions = True
        self._log_ignored_exceptions = True
        self.logger = _FaultLog()
