"""Prometheus metrics: the instruments every app observes and the text exposition that config/ops.py serves.

They live here, at the bottom of the import order, so any app may record into them; nothing here reads
settings or the database. With PROMETHEUS_MULTIPROC_DIR set (several server or worker processes) each process
writes its values to files in that folder and the exposition adds them up."""

import os
import threading
import time
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector

# prometheus-client chooses per-process files or plain values when it is imported; read the variable at the
# same moment, so the exposition always matches what the instruments write.
MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR")

REQUEST_SECONDS = Histogram(
    "mnemo_http_request_duration_seconds",
    "HTTP requests by route name, method and status class.",
    ["route", "method", "status"],
)
# From the server receiving a request to a thread taking it up (config.asgi, config.ops): near zero while
# the server keeps up; waiting for a free thread, or for the GIL on a busy process, once it does not.
REQUEST_QUEUE_SECONDS = Histogram(
    "mnemo_http_request_queue_seconds",
    "HTTP requests' wait between the server receiving them and a thread starting on them.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
# Background requests stepping aside while a foreground call (a context call) runs in their process
# (providers/lanes.py): how much the lanes delayed writes, summed over requests.
BACKGROUND_YIELD_SECONDS = Counter(
    "mnemo_background_yield_seconds",
    "Seconds background requests waited for foreground calls of their process (providers/lanes.py).",
)
# Stages take from well under a millisecond (overlay) to tens of milliseconds (retrieve, render).
CONTEXT_STAGE_SECONDS = Histogram(
    "mnemo_context_stage_duration_seconds",
    "Time of each stage of the context pipeline (context/pipeline.py).",
    ["stage"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
DEGRADATIONS = Counter(
    "mnemo_degradations",
    "Fallbacks taken, by degradation code (providers/degradations.py).",
    ["code"],
)
TASK_SECONDS = Histogram(
    "mnemo_task_duration_seconds",
    "Celery tasks (compaction, message vectors, memory agent, …) by task name and final state.",
    ["task", "outcome"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 180.0, 600.0),
)
CACHE_REPORTS = Counter(
    "mnemo_prefix_cache_usage_reports",
    "Provider usage reports, by provider and whether they matched a context call's prediction.",
    ["provider", "matched"],
)
CACHE_PREDICTED_TOKENS = Counter(
    "mnemo_prefix_cache_predicted_tokens",
    "Cacheable prompt tokens predicted by context calls whose usage was reported.",
    ["provider"],
)
CACHE_ACTUAL_TOKENS = Counter(
    "mnemo_prefix_cache_cached_tokens",
    "Cached prompt tokens the provider reported for those same calls.",
    ["provider"],
)


def context_stages_observe(*, timings: dict[str, float]) -> None:
    """`timings` is the pipeline's state.timings: milliseconds per stage."""
    for stage, milliseconds in timings.items():
        CONTEXT_STAGE_SECONDS.labels(stage=stage).observe(milliseconds / 1000)


def degradation_observe(*, code: str) -> None:
    DEGRADATIONS.labels(code=code).inc()


def cache_usage_observe(*, provider: str, matched: bool, predicted_tokens: int, cached_tokens: int) -> None:
    CACHE_REPORTS.labels(provider=provider, matched="true" if matched else "false").inc()
    if matched:
        # Only calls with a prediction count towards predicted-versus-actual; a report nobody predicted
        # would make the prediction look worse than it is.
        CACHE_PREDICTED_TOKENS.labels(provider=provider).inc(predicted_tokens)
        CACHE_ACTUAL_TOKENS.labels(provider=provider).inc(cached_tokens)


# --- Celery tasks ----------------------------------------------------------------------------------------
# task_prerun and task_postrun fire on the thread that runs the task, eager or on a worker; the start time
# waits here under the task id until the task ends.
_task_started: dict[str, float] = {}
_task_lock = threading.Lock()


def _task_prerun(sender: Any = None, task_id: str | None = None, **kwargs: Any) -> None:
    if task_id is not None:
        with _task_lock:
            _task_started[task_id] = time.perf_counter()


def _task_postrun(
    sender: Any = None, task_id: str | None = None, task: Any = None, state: str | None = None, **kwargs: Any
) -> None:
    with _task_lock:
        started = _task_started.pop(task_id, None) if task_id is not None else None
    if started is None:
        return
    name = getattr(task or sender, "name", None) or "unknown"
    # An eager task that raises (tests, the embedded mode: eager tasks propagate) ends with no state at all.
    outcome = (state or "failure").lower()
    TASK_SECONDS.labels(task=name, outcome=outcome).observe(time.perf_counter() - started)


def celery_task_metrics_connect() -> None:
    """Time every task by its Celery signals (called once by config/celery.py; repeated calls are no-ops)."""
    from celery import signals

    signals.task_prerun.connect(_task_prerun, weak=False, dispatch_uid="mnemo-metrics-prerun")
    signals.task_postrun.connect(_task_postrun, weak=False, dispatch_uid="mnemo-metrics-postrun")


# --- Exposition ------------------------------------------------------------------------------------------


def metrics_render(*, accept: str | None) -> tuple[bytes, str]:
    """Every metric of this process, or of every process sharing PROMETHEUS_MULTIPROC_DIR, in the format the
    scraper's Accept header asks for (Prometheus text 0.0.4 by default, OpenMetrics on request)."""
    registry = REGISTRY
    if MULTIPROC_DIR:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=MULTIPROC_DIR)
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
