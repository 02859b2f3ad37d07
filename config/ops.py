"""What operators and orchestrators poll: liveness (/healthz), readiness (/readyz), Prometheus metrics
(/metrics, guarded by MNEMO_METRICS_ALLOWED_NETWORKS and MNEMO_METRICS_TOKEN), and the middleware that
times every request. The instruments themselves are in providers/metrics.py."""

import hmac
import ipaddress
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from config.startup import warm_state
from providers.metrics import REQUEST_QUEUE_SECONDS, REQUEST_SECONDS, metrics_render
from retrieval.vectors.health import vector_store_check

logger = logging.getLogger(__name__)

# Anything else a client sends as a method is one label value, so a scanner cannot grow the series.
_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}


# Where the server notes when it received a request, in its ASGI scope (config.asgi): a perf_counter().
RECEIVED = "mnemo.received"


class RequestMetricsMiddleware:
    """Request latency by route name, method and status class (mnemo_http_request_duration_seconds), and how
    long a request waited between the server receiving it and a thread taking it up
    (mnemo_http_request_queue_seconds); both in the response's Server-Timing header too (`queue`, `app`), so
    a client can tell a server that is busy from a request that is dear, with `cpu`, what the request's own
    thread ran of `app` (the rest it waited: for the database, a core, the interpreter lock, its helper
    threads). First in MIDDLEWARE, so the time includes the other middleware; a streamed body counts until
    its first byte."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started, cpu_started = time.perf_counter(), time.thread_time()
        received = _received(request)
        response = self.get_response(request)
        finished, cpu = time.perf_counter(), time.thread_time() - cpu_started
        match = getattr(request, "resolver_match", None)
        REQUEST_SECONDS.labels(
            route=match.view_name if match is not None else "unmatched",
            method=request.method if request.method in _METHODS else "other",
            status=f"{response.status_code // 100}xx",
        ).observe(finished - started)
        timing = f"app;dur={(finished - started) * 1000:.1f}, cpu;dur={cpu * 1000:.1f}"
        if received is not None:
            queued = max(0.0, started - received)
            REQUEST_QUEUE_SECONDS.observe(queued)
            timing = f"queue;dur={queued * 1000:.1f}, {timing}"
        response["Server-Timing"] = timing
        return response


def _received(request: HttpRequest) -> float | None:
    """When the server received the request, if it came through config.asgi's threads: a2wsgi's WSGI environ
    carries the ASGI scope. The proxy's async views (/v1/) wait for no thread, and have no `queue`."""
    scope: dict[str, Any] = request.META.get("asgi.scope") or {}
    return scope.get(RECEIVED)


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. Touches no database or cache, so a slow dependency never gets a
    healthy process restarted."""
    return JsonResponse({"status": "ok"})


# Once every migration is applied it stays so for the life of this process (a new migration comes with new
# code, hence a new process): later probes skip loading the migration graph.
_migrations_applied = False


def _check_database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return "ok"


def _check_redis() -> str:
    if not settings.REDIS_URL:
        return "not configured"
    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    finally:
        client.close()
    return "ok"


def _check_migrations() -> str:
    global _migrations_applied
    if not _migrations_applied:
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            return "pending"
        _migrations_applied = True
    return "ok"


@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: the database answers, Redis answers when REDIS_URL is set, every migration is applied, and
    the start-up warm-up (config.startup.caches_warm) has finished. `vector_store` reports the vector
    engine ("ok (numpy)", "ok (milvus)", "degraded (milvus unavailable)"): a degraded engine does not make
    the process unready. 503 names the checks that failed; details go to the log, not to an unauthenticated
    caller."""
    checks: dict[str, str] = {}
    for name, check in (("database", _check_database), ("redis", _check_redis)):
        try:
            checks[name] = check()
        except Exception as exc:
            logger.warning("readiness check %s failed: %r", name, exc)
            checks[name] = f"failed ({type(exc).__name__})"
    if checks["database"] == "ok":
        try:
            checks["migrations"] = _check_migrations()
        except Exception as exc:
            logger.warning("readiness check migrations failed: %r", exc)
            checks["migrations"] = f"failed ({type(exc).__name__})"
    else:
        checks["migrations"] = "not checked"
    checks["warm"] = warm_state()
    # Reported, never failed on: with the engine down, retrieval runs on words alone and says so.
    checks["vector_store"] = vector_store_check()
    failed = [
        name for name, outcome in checks.items() if outcome.startswith("failed") or outcome == "pending"
    ]
    if failed:
        return JsonResponse({"status": "unavailable", "failed": failed, "checks": checks}, status=503)
    return JsonResponse({"status": "ok", "checks": checks})


# Headers a reverse proxy adds: with them REMOTE_ADDR is the proxy's address, not the caller's.
_FORWARDING_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")


def _metrics_refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the caller may read the metrics: its address is in MNEMO_METRICS_ALLOWED_NETWORKS and, when
    MNEMO_METRICS_TOKEN is set, it sends that token as a bearer token."""
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return HttpResponse("Forbidden\n", status=403, content_type="text/plain")
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    token = settings.MNEMO_METRICS_TOKEN
    # Without a token, a proxied request is refused: behind a proxy on this host every caller would look
    # like loopback.
    proxied = any(request.META.get(h) for h in _FORWARDING_HEADERS)
    if (proxied and not token) or not any(address in net for net in settings.MNEMO_METRICS_ALLOWED_NETWORKS):
        return HttpResponse("Forbidden\n", status=403, content_type="text/plain")
    if token:
        scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(sent.strip().encode(), token.encode()):
            response = HttpResponse("Unauthorized\n", status=401, content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    return None


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    refusal = _metrics_refusal(request)
    if refusal is not None:
        return refusal
    body, content_type = metrics_render(accept=request.headers.get("Accept"))
    return HttpResponse(body, content_type=content_type)
