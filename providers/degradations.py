"""Counters of fallbacks taken (`mnemo:degradations:<code>` in the cache, and the Prometheus counter
mnemo_degradations_total), shared by every app that degrades: the context pipeline, the memory agent. Each
caller also logs and reports its own degradation."""

from django.core.cache import cache

from providers.metrics import degradation_observe


def degradation_count(code: str) -> None:
    degradation_observe(code=code)
    key = f"mnemo:degradations:{code}"
    if not cache.add(key, 1, timeout=None):
        try:
            cache.incr(key)
        except ValueError:  # expired or evicted between add and incr
            cache.set(key, 1, timeout=None)
