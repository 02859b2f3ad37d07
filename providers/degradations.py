"""Counters of fallbacks taken (`mnemo:degradations:<code>` in the cache), shared by every app that degrades:
the context pipeline, the memory agent. Each caller also logs and reports its own degradation."""

from django.core.cache import cache


def degradation_count(code: str) -> None:
    key = f"mnemo:degradations:{code}"
    if not cache.add(key, 1, timeout=None):
        try:
            cache.incr(key)
        except ValueError:  # expired or evicted between add and incr
            cache.set(key, 1, timeout=None)
