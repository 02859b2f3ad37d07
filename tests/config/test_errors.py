"""Errors under /api/ and /v1/ come back as JSON in the API's shape (the proxy's: its SDK's shape), 500s
included, with a request id in the body, in X-Request-Id and in the log line with the traceback; the admin
and the other pages keep Django's own pages."""

import asyncio
import logging

import httpx
import pytest
from django.test import Client

from context.proxy import views as proxy_views
from context.proxy.asgi import ProxyASGIHandler
from conversations import apis as conversation_apis

pytestmark = pytest.mark.django_db


def _explode(*args, **kwargs):
    raise RuntimeError("database is locked")


@pytest.fixture(params=[False, True], ids=["debug-off", "debug-on"])
def debug(request, settings):
    # `make run` serves with DEBUG on: Django's debug pages (HTML) must not reach API clients either.
    settings.DEBUG = request.param
    return request.param


def test_an_unhandled_exception_is_a_json_500_with_the_request_id_logged(owner, monkeypatch, caplog, debug):
    monkeypatch.setattr(conversation_apis, "conversation_list", _explode)

    with caplog.at_level(logging.ERROR, logger="mnemo.errors"):
        response = owner.client.get("/api/v1/conversations")

    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == "internal_error"
    assert error["request_id"] == response["X-Request-Id"]
    [record] = [r for r in caplog.records if r.name == "mnemo.errors"]
    assert error["request_id"] in record.getMessage()
    assert "database is locked" in caplog.text  # the traceback is in the log, not in the body
    assert "database is locked" not in response.content.decode()


def test_an_outsider_gets_the_same_json_404_as_an_unknown_url(owner, outsider, conversation, debug):
    mine = owner.client.get(f"/api/v1/conversations/{conversation.pk}")
    theirs = outsider.client.get(f"/api/v1/conversations/{conversation.pk}")
    unknown = owner.client.get("/api/v1/no-such-thing")

    assert mine.status_code == 200
    for response in (theirs, unknown):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
        assert response.json()["error"]["request_id"] == response["X-Request-Id"]


@pytest.mark.urls("tests.config.errors_urls")
def test_a_plain_django_405_under_the_api_is_json(owner, debug):
    response = owner.client.get("/api/v1/test/post-only")

    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_a_client_request_id_is_kept_and_a_bad_one_replaced(owner):
    kept = owner.client.get("/api/v1/no-such-thing", HTTP_X_REQUEST_ID="gw-7f3a.1")
    replaced = owner.client.get("/api/v1/no-such-thing", HTTP_X_REQUEST_ID="bad id\twith spaces")

    assert kept["X-Request-Id"] == "gw-7f3a.1" == kept.json()["error"]["request_id"]
    assert replaced["X-Request-Id"].startswith("req_")


def test_a_drf_refusal_carries_the_request_id(anonymous):
    response = anonymous.get("/api/v1/conversations")

    assert response.status_code == 401
    assert response.json()["error"]["request_id"] == response["X-Request-Id"]


def test_pages_outside_the_api_keep_djangos_error_pages(db):
    response = Client().get("/no-such-page")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


# --- the proxy (its own ASGI handler, no middleware) ------------------------------------------------------


def _proxy_call(method: str, path: str, **kwargs) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=ProxyASGIHandler())
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(call())


def test_a_proxy_failure_is_a_500_in_the_openai_shape(monkeypatch, caplog, debug):
    monkeypatch.setattr(proxy_views, "_prepare", _explode)

    with caplog.at_level(logging.ERROR, logger="mnemo.errors"):
        response = _proxy_call("POST", "/v1/chat/completions", json={"model": "gpt-4o", "messages": []})

    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    assert error["request_id"] == response.headers["x-request-id"]
    assert error["request_id"] in caplog.text and "database is locked" in caplog.text


def test_a_proxy_failure_is_a_500_in_the_anthropic_shape(monkeypatch, debug):
    monkeypatch.setattr(proxy_views, "_prepare", _explode)

    response = _proxy_call("POST", "/v1/messages", json={"model": "claude", "messages": []})

    assert response.status_code == 500
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    assert body["request_id"] == response.headers["x-request-id"]


def test_an_unknown_proxy_url_is_a_json_404(debug):
    response = _proxy_call("GET", "/v1/no-such-endpoint")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_djangos_own_request_log_line_names_the_request_id(owner):
    from config.errors import RequestIdInLog

    response = owner.client.get("/api/v1/no-such-thing")
    request = type("Request", (), {"request_id": response["X-Request-Id"]})()
    record = logging.LogRecord("django.request", logging.WARNING, __file__, 1, "Not Found: %s", ("/x",), None)
    record.request = request

    assert RequestIdInLog().filter(record)
    assert record.getMessage() == f"Not Found: /x (request_id={response['X-Request-Id']})"
