"""A fallback taken (Degradation, as responses report it) and its counters (`mnemo:degradations:<code>` in the
cache, and the Prometheus counter mnemo_degradations_total), shared by every app that degrades: the context
pipeline, retrieval, the memory agent. Each caller also logs and reports its own degradation."""

from dataclasses import dataclass

from django.core.cache import cache

from providers.metrics import degradation_observe


@dataclass(frozen=True)
class Degradation:
    """A fallback taken, as a response reports it: its code, what it means for the answer, and the stage of
    the context call that took it (None outside the context call)."""

    code: str
    message: str
    stage: str | None = None


def degradation_count(code: str) -> None:
    degradation_observe(code=code)
    key = f"mnemo:degradations:{code}"
    if not cache.add(key, 1, timeout=None):
        try:
            cache.incr(key)
        except ValueError:  # expired or evicted between add and incr
            cache.set(key, 1, timeout=None)
