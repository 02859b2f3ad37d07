"""Hostile input to conversations and messages: NUL characters and lone surrogates in any JSON string,
integers beyond their column, JSON nested too deep, metadata within the message size limit, multipart
uploads held to the request limit, and parameters that are refused instead of ignored. Each is a 4xx in the
error shape, never a 500 or an HTML page, and stores nothing; an outsider gets a 404 as for any other body.

A NUL was a 500 on PostgreSQL (text and jsonb cannot hold one) and stored as sent on SQLite: these tests
failed on both before, and the 400 holds on both."""

import io
import json

import pytest

from conversations.models import Conversation, Message
from prefix_cache.models import CacheUsage
from tenants.validation import INT32_MAX, MAX_JSON_DEPTH

pytestmark = pytest.mark.django_db

NUL = "\x00"


def url(conversation, suffix="/messages"):
    return f"/api/v1/conversations/{conversation.id}{suffix}"


def post(actor, conversation, payload, suffix="/messages"):
    return actor.client.post(url(conversation, suffix), payload, format="json")


def post_raw(actor, path, body: bytes, content_type="application/json"):
    return actor.client.post(path, body, content_type=content_type)


def error(response):
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    return response.json()["error"]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# --- 5. NUL characters --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "where"),
    [
        ({"role": "user", "parts": [{"type": "text", "text": f"a{NUL}b"}]}, "parts.0.text"),
        (
            {
                "role": "assistant",
                "parts": [{"type": "tool_call", "id": "c1", "name": "f", "arguments": {"q": f"x{NUL}"}}],
            },
            "parts.0.arguments.q",
        ),
        ({"role": "user", "content": "x", "metadata": {"note": f"a{NUL}"}}, "metadata.note"),
        ({"role": "user", "content": "x", "metadata": {f"k{NUL}": "v"}}, "metadata.k\\x00"),
    ],
)
def test_nul_in_parts_or_metadata_is_a_400(owner, conversation, message, where):
    response = post(owner, conversation, message)
    assert response.status_code == 400
    body = error(response)
    assert body["code"] == "null_characters_not_allowed"
    assert body["message"].startswith(f"{where}: ")
    assert not Message.objects.exists()


def test_nul_in_content_keeps_its_field_error(owner, conversation):
    # Refused before (DRF's CharField); the same code as in metadata, now from the parser.
    response = post(owner, conversation, {"role": "user", "content": f"a{NUL}b"})
    assert response.status_code == 400
    assert error(response)["code"] == "null_characters_not_allowed"


def test_nul_in_a_batch_item_stores_none_of_the_batch(owner, conversation):
    batch = {
        "messages": [
            {"role": "user", "content": "ok"},
            {"role": "user", "content": "x", "metadata": {"a": NUL}},
        ]
    }
    response = post(owner, conversation, batch)
    assert response.status_code == 400
    assert error(response)["message"].startswith("messages.1.metadata.a: ")
    assert not Message.objects.exists()


def test_nul_in_conversation_metadata_is_a_400(owner, conversation):
    created = owner.client.post("/api/v1/conversations", {"metadata": {"a": NUL}}, format="json")
    assert created.status_code == 400
    assert error(created)["code"] == "null_characters_not_allowed"
    patched = owner.client.patch(url(conversation, ""), {"metadata": {"a": [f"x{NUL}"]}}, format="json")
    assert patched.status_code == 400
    assert error(patched)["message"].startswith("metadata.a.0: ")
    conversation.refresh_from_db()
    assert conversation.metadata == {} and Conversation.objects.count() == 1


def test_nul_in_an_amended_message_is_a_400(owner, conversation):
    mid = post(owner, conversation, {"role": "assistant", "content": "partial", "completed": False}).json()[
        "id"
    ]
    response = owner.client.patch(
        url(conversation, f"/messages/{mid}"), {"parts": [{"type": "text", "text": NUL}]}, format="json"
    )
    assert response.status_code == 400
    assert error(response)["code"] == "null_characters_not_allowed"
    assert Message.objects.get(pk=mid).content == "partial"


@pytest.mark.parametrize(
    "lines",
    [
        [{"type": "conversation", "version": 1, "title": f"t{NUL}"}],
        [{"uuid": "u1", "role": "user", "content": f"hi{NUL}"}],
        [{"uuid": "u1", "role": "user", "content": "hi", "metadata": {"k": NUL}}],
    ],
)
def test_nul_in_an_imported_transcript_is_a_400(owner, lines):
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    response = post_raw(owner, "/api/v1/conversations/import", body, "application/x-ndjson")
    assert response.status_code == 400
    err = error(response)
    assert err["code"] == "null_characters_not_allowed"
    assert err["extra"]["line"] == 1
    assert not Conversation.objects.exists()


def test_an_outsider_gets_404_whatever_the_body(outsider, conversation):
    # The access check comes first: a refused body says nothing about another tenant's conversation.
    hostile = {"role": "user", "content": "x", "metadata": {"a": NUL}}
    assert post(outsider, conversation, hostile).status_code == 404
    deep = f'{{"role":"user","content":"x","metadata":{{"a":{nested(10_000)}}}}}'.encode()
    assert post_raw(outsider, url(conversation), deep).status_code == 404
    assert not Message.objects.exists()


# --- 6. integers beyond their column ------------------------------------------------------------------------


def test_a_token_count_beyond_the_column_in_appended_usage_is_a_field_error(owner, conversation):
    message = {
        "role": "assistant",
        "content": "Paris.",
        "usage": {"prompt_tokens": 10**30, "completion_tokens": 3},
    }
    response = post(owner, conversation, message)
    assert response.status_code == 400
    err = error(response)
    assert err["code"] == "max_value"
    assert err["extra"]["fields"] == {
        "usage": {
            "prompt_tokens": [
                {"code": "max_value", "message": f"Ensure this value is less than or equal to {INT32_MAX}."}
            ]
        }
    }
    assert not Message.objects.exists() and not CacheUsage.objects.exists()


def test_the_largest_count_the_column_holds_is_taken(owner, conversation):
    message = {"role": "assistant", "content": "ok", "usage": {"prompt_tokens": INT32_MAX}}
    assert post(owner, conversation, message).status_code == 201
    assert CacheUsage.objects.get().prompt_tokens == INT32_MAX


def test_after_seq_beyond_a_bigint_is_a_400(owner, conversation):
    response = owner.client.get(url(conversation), {"after_seq": 10**30})
    assert response.status_code == 400
    assert error(response)["code"] == "max_value"


# --- 9. depth, surrogates, sizes, strict parameters ---------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
def test_json_nested_too_deep_is_refused_before_parsing(owner, conversation, depth):
    body = f'{{"role":"user","content":"x","metadata":{{"a":{nested(depth)}}}}}'.encode()
    response = post_raw(owner, url(conversation), body)
    assert response.status_code == 400
    err = error(response)
    assert err["code"] == "json_too_deep"
    assert err["extra"] == {"limit_depth": MAX_JSON_DEPTH}
    assert not Message.objects.exists()


def test_json_at_the_depth_limit_is_taken(owner, conversation):
    # The body is one level, metadata another: 30 more make 32.
    body = f'{{"role":"user","content":"x","metadata":{{"a":{nested(MAX_JSON_DEPTH - 2)}}}}}'.encode()
    assert post_raw(owner, url(conversation), body).status_code == 201


def test_brackets_inside_strings_do_not_count_as_depth(owner, conversation):
    text = '[{"\\"' * 200
    response = post(owner, conversation, {"role": "user", "content": text, "metadata": {"k": text}})
    assert response.status_code == 201
    assert Message.objects.get().metadata == {"k": text}


@pytest.mark.parametrize(
    "body",
    [
        b'{"role":"user","content":"ok","metadata":{"k":"\\ud800"}}',
        b'{"role":"user","parts":[{"type":"text","text":"a\\udfffb"}]}',
        b'{"role":"user","content":"ok","metadata":{"\\ud800":1}}',
    ],
)
def test_a_lone_surrogate_anywhere_is_a_400(owner, conversation, body):
    response = post_raw(owner, url(conversation), body)
    assert response.status_code == 400
    assert error(response)["code"] == "surrogate_characters_not_allowed"
    assert not Message.objects.exists()


def test_a_surrogate_pair_is_a_character_not_a_problem(owner, conversation):
    response = post_raw(owner, url(conversation), b'{"role":"user","content":"ok \\ud83d\\ude00"}')
    assert response.status_code == 201
    assert response.json()["content"] == "ok \U0001f600"


def test_metadata_counts_in_the_message_size(owner, conversation, settings):
    settings.MNEMO_MAX_MESSAGE_BYTES = 1000
    response = post(owner, conversation, {"role": "user", "content": "x", "metadata": {"k": "y" * 2000}})
    assert response.status_code == 400
    err = error(response)
    assert err["code"] == "message_too_large"
    assert err["extra"]["size_bytes"] > 2000
    assert not Message.objects.exists()


def test_metadata_counts_in_the_size_of_an_amended_message(owner, conversation, settings):
    mid = post(owner, conversation, {"role": "user", "content": "x"}).json()["id"]
    settings.MNEMO_MAX_MESSAGE_BYTES = 1000
    response = owner.client.patch(
        url(conversation, f"/messages/{mid}"), {"metadata": {"k": "y" * 2000}}, format="json"
    )
    assert response.status_code == 400
    assert error(response)["code"] == "message_too_large"
    assert Message.objects.get(pk=mid).metadata == {}


def test_metadata_counts_in_the_size_of_an_imported_message(owner, settings):
    settings.MNEMO_MAX_MESSAGE_BYTES = 1000
    line = {"uuid": "u1", "role": "user", "content": "x", "metadata": {"k": "y" * 2000}}
    response = post_raw(
        owner, "/api/v1/conversations/import", (json.dumps(line) + "\n").encode(), "application/x-ndjson"
    )
    assert response.status_code == 400
    assert error(response)["code"] == "invalid_transcript"
    assert not Conversation.objects.exists()


@pytest.mark.parametrize("limit", ["-1", "0", "null", "ten"])
def test_a_conversation_page_size_it_cannot_read_is_a_400(owner, conversation, limit):
    response = owner.client.get("/api/v1/conversations", {"limit": limit})
    assert response.status_code == 400
    assert error(response)["extra"]["fields"]["limit"]


def test_a_conversation_page_size_above_the_maximum_is_still_capped(owner, conversation):
    response = owner.client.get("/api/v1/conversations", {"limit": 5000})
    assert response.status_code == 200


@pytest.mark.parametrize(
    "payload",
    [
        {"role": "user", "content": "x", "completed": 0},
        {"role": "user", "content": "x", "is_error": "yes"},
        {"role": "user", "content": "x", "completed": "false"},
    ],
)
def test_a_boolean_must_be_true_or_false(owner, conversation, payload):
    response = post(owner, conversation, payload)
    assert response.status_code == 400
    assert error(response)["code"] == "invalid"
    assert not Message.objects.exists()


def test_archived_must_be_a_boolean(owner, conversation):
    response = owner.client.patch(url(conversation, ""), {"archived": 1}, format="json")
    assert response.status_code == 400
    conversation.refresh_from_db()
    assert conversation.archived_at is None


# --- 8. multipart uploads -----------------------------------------------------------------------------------


def _upload(size: int) -> io.BytesIO:
    data = io.BytesIO(b"\x89PNG\r\n\x1a\n" + b"\0" * size)
    data.name = "screen.png"
    return data


def test_an_upload_over_the_request_limit_is_a_413_before_the_body_is_read(
    owner, conversation, settings, monkeypatch
):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
    read = []
    from django.http.multipartparser import MultiPartParser

    monkeypatch.setattr(MultiPartParser, "parse", lambda self: read.append(1) or ({}, {}))
    message = {"role": "user", "parts": [{"type": "image", "upload": "shot"}]}
    response = owner.client.post(
        url(conversation),
        {"message": json.dumps(message), "shot": _upload(3 * 1024 * 1024)},
        format="multipart",
    )
    assert response.status_code == 413
    err = error(response)
    assert err["code"] == "request_too_large"
    assert err["extra"] == {"limit_bytes": 1024 * 1024}
    assert read == []  # refused from Content-Length: the form was never parsed
    assert not Message.objects.exists()


def test_an_outsider_upload_over_the_limit_is_still_a_404(outsider, conversation, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
    response = outsider.client.post(
        url(conversation), {"message": "{}", "shot": _upload(2 * 1024 * 1024)}, format="multipart"
    )
    assert response.status_code == 404


def test_more_files_than_django_takes_is_a_json_400(owner, conversation, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 3
    files = {f"f{i}": _upload(10) for i in range(4)}
    response = owner.client.post(
        url(conversation),
        {"message": json.dumps({"role": "user", "content": "x"}), **files},
        format="multipart",
    )
    assert response.status_code == 400
    err = error(response)
    assert err["code"] == "too_many_files"
    assert err["extra"] == {"limit": 3}
    assert not Message.objects.exists()


def test_the_multipart_message_field_is_checked_as_a_json_body(owner, conversation):
    message = {"role": "user", "content": "x", "metadata": {"a": NUL}}
    response = owner.client.post(url(conversation), {"message": json.dumps(message)}, format="multipart")
    assert response.status_code == 400
    assert error(response)["code"] == "null_characters_not_allowed"
    deep = '{"role":"user","content":"x","metadata":' + nested(1000) + "}"
    response = owner.client.post(url(conversation), {"message": deep}, format="multipart")
    assert response.status_code == 400
    assert error(response)["code"] == "json_too_deep"
    assert not Message.objects.exists()
