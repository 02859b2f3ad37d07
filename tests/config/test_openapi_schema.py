"""The OpenAPI schema documents the API it describes: generated without a warning (a component-name or
operationId collision is one), every request body that refuses unknown fields says so, and the key bodies
carry their real fields. `make schema-check` then holds the running server to it."""

import json
from collections import Counter
from pathlib import Path

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema(tmp_path_factory, django_db_blocker) -> dict:
    path = Path(tmp_path_factory.mktemp("schema")) / "schema.json"
    with django_db_blocker.unblock():
        # --fail-on-warn: spectacular warns on two serializers with one component name and on an
        # operationId collision, and validates the result against the OpenAPI 3 meta-schema.
        call_command(
            "spectacular", "--validate", "--fail-on-warn", "--format", "openapi-json", "--file", path
        )
    return json.loads(path.read_text())


def resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def operation(schema: dict, path: str, method: str) -> dict:
    return schema["paths"][f"/api/v1/{path}"][method]


def request_body(schema: dict, path: str, method: str = "post") -> dict:
    content = operation(schema, path, method)["requestBody"]["content"]["application/json"]
    return resolve(schema, content["schema"])


def response_body(schema: dict, path: str, method: str = "get", status: str = "200") -> dict:
    content = operation(schema, path, method)["responses"][status]["content"]["application/json"]
    return resolve(schema, content["schema"])


def test_operation_ids_are_unique(schema):
    ids = [
        op["operationId"] for item in schema["paths"].values() for op in item.values() if "operationId" in op
    ]
    assert [name for name, n in Counter(ids).items() if n > 1] == []
    assert "conversations_messages_list" in ids and "conversations_list" in ids


def test_each_view_has_its_own_input_component(schema):
    names = schema["components"]["schemas"]
    assert "InputRequest" not in names and "PatchedInputRequest" not in names
    assert {"ConversationListCreateInputRequest", "ContextInputRequest", "CompactInputRequest"} <= set(names)


def test_post_conversations_documents_its_own_fields(schema):
    body = request_body(schema, "conversations")
    assert set(body["properties"]) == {"end_user", "model", "title", "metadata"}
    assert body["properties"]["metadata"]["type"] == "object"
    assert body["additionalProperties"] is False


def test_the_context_call_documents_its_request_and_response(schema):
    body = request_body(schema, "conversations/{conversation_id}/context")
    assert {"user_message", "user_message_id", "token_budget", "format", "attachments"} <= set(
        body["properties"]
    )
    assert body["additionalProperties"] is False
    assert body["oneOf"] == [{"required": ["user_message"]}, {"required": ["user_message_id"]}]
    answer = response_body(schema, "conversations/{conversation_id}/context", "post")
    assert {"context_id", "system", "messages", "blocks", "tokens", "prefix", "degradations"} <= set(
        answer["required"]
    )
    tokens = resolve(schema, answer["properties"]["tokens"])
    assert set(tokens["properties"]) == {"system", "history", "user", "total", "exact"}


def test_appending_messages_documents_one_message_or_a_batch(schema):
    content = operation(schema, "conversations/{conversation_id}/messages", "post")["requestBody"]["content"]
    choices = [resolve(schema, s) for s in resolve(schema, content["application/json"]["schema"])["oneOf"]]
    single, batch = choices
    assert {"role", "content", "parts", "idempotency_key", "usage"} <= set(single["properties"])
    assert single["required"] == ["role"] and single["additionalProperties"] is False
    assert resolve(schema, single["properties"]["role"]["allOf"][0])["enum"] == [
        "system",
        "user",
        "assistant",
        "tool",
    ]
    assert set(batch["properties"]) == {"messages"} and batch["additionalProperties"] is False
    assert "multipart/form-data" in content


@pytest.mark.parametrize(
    "path, item",
    [("conversations", "ConversationOutput"), ("documents", "DocumentOutput")],
)
def test_paginated_lists_are_documented_as_pages(schema, path, item):
    page = response_body(schema, path)
    assert set(page["properties"]) == {"next", "previous", "results"}
    assert page["properties"]["results"]["items"]["$ref"].endswith(f"/{item}")


def test_task_state_answers_name_the_epochs(schema):
    answer = response_body(schema, "conversations/{conversation_id}/state/events", "post", "201")
    assert {"epoch", "base_epoch", "state", "pending_events", "event"} <= set(answer["properties"])


def test_no_endpoint_is_documented_as_a_bare_object(schema):
    """`responses={200: dict}` documents nothing; every JSON answer names its fields."""
    bare = []
    for path, item in schema["paths"].items():
        for method, op in item.items():
            for status, response in op.get("responses", {}).items():
                body = response.get("content", {}).get("application/json", {}).get("schema")
                if body is not None and not {"properties", "oneOf"} & set(resolve(schema, body)):
                    bare.append(f"{method.upper()} {path} {status}")
    assert bare == []


def test_the_api_key_scheme_is_documented(schema):
    assert schema["components"]["securitySchemes"]["ApiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "Tenant API key",
    }
    assert operation(schema, "conversations", "post")["security"] == [{"ApiKey": []}]


def test_state_events_document_each_event_type_and_block_patches_need_a_change(schema):
    body = request_body(schema, "conversations/{conversation_id}/state/events")
    shapes = {s["properties"]["event_type"]["pattern"]: s["properties"]["payload"] for s in body["oneOf"]}
    assert shapes["^set$"]["required"] == ["path"]
    assert shapes["^merge$"]["required"] == ["value"]
    assert shapes["^merge$"]["properties"]["value"] == {"type": "object"}
    patch = request_body(schema, "users/{external_id}/memory/blocks/{label}", "patch")
    assert [r["required"] for r in patch["anyOf"]] == [["value"], ["append"], ["char_limit"]]
