"""GET /healthz, /readyz and /metrics: liveness without dependencies, readiness naming the check that failed,
metrics for loopback (or the configured networks and token) only, and metrics that move when the context
pipeline, a degradation, a task and a usage report happen."""

import ipaddress
import re
from unittest import mock

import httpx
import pytest
from django.db import OperationalError
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from config import ops
from retrieval.vectors.config import parse_vector_store
from retrieval.vectors.current import vector_store_reset
from tests.context.helpers import context
from tests.retrieval.vectors.test_engine import _closed_port

pytestmark = pytest.mark.django_db


def scrape(client=None, **extra):
    response = (client or Client()).get("/metrics", **extra)
    assert response.status_code == 200, response.content
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# --- /healthz --------------------------------------------------------------------------------------------


def test_healthz_answers_ok_without_touching_the_database(django_assert_num_queries):
    with mock.patch.object(ops, "connection") as connection:
        connection.cursor.side_effect = OperationalError("down")
        with django_assert_num_queries(0):
            response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"]


# --- /readyz ---------------------------------------------------------------------------------------------


def test_readyz_is_ok_when_the_database_answers_and_migrations_are_applied(settings):
    settings.REDIS_URL = ""
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "status": "ok",
        "checks": {
            "database": "ok",
            "redis": "not configured",
            "migrations": "ok",
            "warm": "off",
            "vector_store": "ok (numpy)",
        },
    }


def test_readyz_names_the_database_when_it_cannot_be_reached(settings):
    settings.REDIS_URL = ""
    with mock.patch.object(ops, "connection") as connection:
        connection.cursor.side_effect = OperationalError("could not connect to server")
        response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["failed"] == ["database"]
    assert body["checks"] == {
        "database": "failed (OperationalError)",
        "redis": "not configured",
        "migrations": "not checked",
        "warm": "off",
        "vector_store": "ok (numpy)",
    }
    # The reason itself goes to the log, not to an unauthenticated caller.
    assert "could not connect" not in response.content.decode()


def test_readyz_waits_for_the_start_up_warm_up(settings, monkeypatch):
    settings.REDIS_URL = ""
    monkeypatch.setattr(ops, "warm_state", lambda: "pending")
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["failed"] == ["warm"]


def test_readyz_names_pending_migrations(settings, monkeypatch):
    settings.REDIS_URL = ""
    monkeypatch.setattr(ops, "_migrations_applied", False)
    with mock.patch.object(ops.MigrationExecutor, "migration_plan", return_value=[("migration", False)]):
        response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["failed"] == ["migrations"]
    assert response.json()["checks"]["migrations"] == "pending"


def test_readyz_names_redis_when_it_is_configured_and_unreachable(settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["failed"] == ["redis"]
    assert response.json()["checks"]["database"] == "ok"


def test_readyz_reports_a_vector_engine_that_is_down_without_failing(settings):
    settings.REDIS_URL = ""
    settings.MNEMO_VECTOR_STORE = parse_vector_store(f"milvus://127.0.0.1:{_closed_port()}")
    try:
        response = Client().get("/readyz")
    finally:
        vector_store_reset()
    # Retrieval runs on words alone meanwhile (and says so): the process stays ready.
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "ok"
    assert response.json()["checks"]["vector_store"] == "degraded (milvus unavailable)"


@pytest.mark.redis
def test_readyz_checks_the_configured_redis():
    from django.conf import settings

    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL")
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["checks"]["redis"] == "ok"


# --- /metrics: who may read it ---------------------------------------------------------------------------


def test_metrics_are_served_to_loopback_in_the_prometheus_text_format():
    response = Client().get("/metrics")  # the test client's REMOTE_ADDR is 127.0.0.1
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"# TYPE mnemo_http_request_duration_seconds histogram" in response.content
    assert Client().get("/metrics", REMOTE_ADDR="::1").status_code == 200


def test_metrics_are_refused_to_other_addresses_and_to_proxied_requests():
    assert Client().get("/metrics", REMOTE_ADDR="203.0.113.9").status_code == 403
    assert Client().get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403
    # A reverse proxy on this host connects from loopback for every caller: without a token, refused.
    proxied = Client().get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert proxied.status_code == 403
    assert b"mnemo_" not in proxied.content


def test_metrics_networks_come_from_the_setting(settings):
    settings.MNEMO_METRICS_ALLOWED_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    assert Client().get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert Client().get("/metrics", REMOTE_ADDR="::ffff:10.1.2.3").status_code == 200
    assert Client().get("/metrics").status_code == 403  # loopback is no longer listed


def test_with_a_token_metrics_need_it_as_a_bearer_token(settings):
    settings.MNEMO_METRICS_TOKEN = "s3cret-scrape-token"
    assert Client().get("/metrics").status_code == 401
    wrong = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer nope")
    assert wrong.status_code == 401
    assert wrong["WWW-Authenticate"].startswith("Bearer")
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token").status_code == 200
    # The networks still apply; to scrape from anywhere with the token, allow every network.
    remote = {"REMOTE_ADDR": "203.0.113.9", "HTTP_AUTHORIZATION": "Bearer s3cret-scrape-token"}
    assert Client().get("/metrics", **remote).status_code == 403
    settings.MNEMO_METRICS_ALLOWED_NETWORKS = [ipaddress.ip_network("0.0.0.0/0")]
    assert Client().get("/metrics", **remote).status_code == 200
    assert Client().get("/metrics", **remote, HTTP_X_FORWARDED_FOR="203.0.113.9").status_code == 200


def test_an_api_key_does_not_open_the_metrics(owner):
    assert owner.client.get("/metrics", REMOTE_ADDR="203.0.113.9").status_code == 403


# --- /metrics: what moves --------------------------------------------------------------------------------


def test_a_context_call_moves_the_stage_timings_and_the_request_latency(owner, conversation):
    before = scrape()
    context(owner, conversation, user_message="hi")
    after = scrape()
    for stage in ("load", "overlay", "rewrite", "retrieve", "decay", "budget", "render", "hint"):
        name = "mnemo_context_stage_duration_seconds_count"
        assert value(after, name, stage=stage) == value(before, name, stage=stage) + 1, stage
    name = "mnemo_http_request_duration_seconds_count"
    labels = {"route": "context", "method": "POST", "status": "2xx"}
    assert value(after, name, **labels) == value(before, name, **labels) + 1


def test_a_degradation_moves_its_counter(owner, conversation):
    before = scrape()
    body = context(owner, conversation, user_message="hi", model="acme-llm-7b")
    assert [d["code"] for d in body["degradations"]] == ["unknown_model"]
    after = scrape()
    name = "mnemo_degradations_total"
    assert value(after, name, code="unknown_model") == value(before, name, code="unknown_model") + 1


def test_unknown_routes_and_methods_do_not_grow_the_label_set():
    before = scrape()
    Client().get("/no/such/page/12345")
    Client().generic("BREW", "/healthz")
    after = scrape()
    name = "mnemo_http_request_duration_seconds_count"
    unmatched = {"route": "unmatched", "method": "GET", "status": "4xx"}
    assert value(after, name, **unmatched) == value(before, name, **unmatched) + 1
    brew = {"route": "healthz", "method": "other", "status": "4xx"}
    assert value(after, name, **brew) == value(before, name, **brew) + 1


def test_a_response_says_how_long_the_server_worked_on_it(owner, conversation):
    """Server-Timing `app`: the middleware and the view, and `cpu`, what the request's thread ran of it;
    without the server in front (the test client) there is no `queue` to tell."""
    response = owner.client.get(f"/api/v1/conversations/{conversation.id}")
    assert response.status_code == 200
    timing = re.fullmatch(r"app;dur=(\d+\.\d), cpu;dur=(\d+\.\d)", response["Server-Timing"])
    assert timing is not None, response["Server-Timing"]
    assert float(timing[2]) <= float(timing[1]) + 0.1  # a thread cannot run longer than it took


@pytest.mark.django_db(transaction=True)
def test_through_the_server_a_response_says_how_long_it_waited_for_a_thread():
    """Through uvicorn and config.asgi, as deployed: `queue` is the wait between the server receiving the
    request and a thread starting on it; the histogram counts it."""
    from tests.conversations.test_websocket_server import server

    before = value(scrape(), "mnemo_http_request_queue_seconds_count")
    with server() as ws_url:
        response = httpx.get("http" + ws_url.removeprefix("ws") + "/healthz", timeout=10)
    assert response.status_code == 200
    timing = re.fullmatch(
        r"queue;dur=(\d+\.\d), app;dur=(\d+\.\d), cpu;dur=\d+\.\d", response.headers["server-timing"]
    )
    assert timing is not None, response.headers["server-timing"]
    assert value(scrape(), "mnemo_http_request_queue_seconds_count") == before + 1


def test_task_outcomes_and_durations_are_counted(conversation):
    from summaries.tasks import compact_conversation

    name = "mnemo_task_duration_seconds_count"
    task = "summaries.tasks.compact_conversation"
    before = scrape()
    compact_conversation.delay(str(conversation.id))
    failing = mock.patch(
        "summaries.services.compaction.queue.compaction_run_queued", side_effect=RuntimeError("boom")
    )
    with failing, pytest.raises(RuntimeError):
        compact_conversation.delay(str(conversation.id))
    after = scrape()
    assert (
        value(after, name, task=task, outcome="success")
        == value(before, name, task=task, outcome="success") + 1
    )
    assert (
        value(after, name, task=task, outcome="failure")
        == value(before, name, task=task, outcome="failure") + 1
    )


def test_usage_reports_count_predicted_against_cached_tokens(owner, conversation):
    from tests.prefix_cache.test_usage import OPENAI_CHAT_COMPLETION

    call = context(owner, conversation, user_message="hi")
    before = scrape()
    response = owner.client.post(
        f"/api/v1/conversations/{conversation.id}/usage",
        {"usage": OPENAI_CHAT_COMPLETION, "context_id": call["context_id"]},
        format="json",
    )
    assert response.status_code == 200, response.content
    after = scrape()
    reports = ("mnemo_prefix_cache_usage_reports_total", {"provider": "openai", "matched": "true"})
    assert value(after, reports[0], **reports[1]) == value(before, reports[0], **reports[1]) + 1
    cached = "mnemo_prefix_cache_cached_tokens_total"
    assert value(after, cached, provider="openai") == value(before, cached, provider="openai") + 1920
    predicted = "mnemo_prefix_cache_predicted_tokens_total"
    assert (
        value(after, predicted, provider="openai")
        == value(before, predicted, provider="openai") + (call["prefix"]["predicted_cached_tokens"])
    )
