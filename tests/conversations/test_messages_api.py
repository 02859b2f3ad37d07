import pytest

from conversations.models import Message, Turn
from providers.tokens import count_message
from tests.factories import ArchivedImageFactory

pytestmark = pytest.mark.django_db


def url(conversation, suffix=""):
    return f"/api/v1/conversations/{conversation.id}/messages{suffix}"


def post(actor, conversation, payload, **headers):
    return actor.client.post(url(conversation), payload, format="json", headers=headers)


def test_append_assigns_seq_and_counts_tokens_once(owner, conversation):
    first = post(owner, conversation, {"role": "user", "content": "What is the capital of France?"})
    second = post(owner, conversation, {"role": "assistant", "content": "Paris."})
    assert (first.status_code, second.status_code) == (201, 201)
    assert (first.json()["seq"], second.json()["seq"]) == (1, 2)
    expected = count_message(role="user", content="What is the capital of France?", model="gpt-4o")
    assert first.json()["token_count"] == expected
    assert Message.objects.get(pk=first.json()["id"]).token_count == expected
    conversation.refresh_from_db()
    assert conversation.last_seq == 2


def test_parts_only_message_takes_its_text_from_the_parts(owner, conversation):
    ArchivedImageFactory(tenant=owner.tenant, id="img_abc123")
    parts = [
        {"type": "text", "text": "Look at this"},
        {"type": "image", "image_id": "img_abc123", "detail": "low"},
        {"type": "text", "text": "and this"},
    ]
    body = post(owner, conversation, {"role": "user", "parts": parts}).json()
    assert body["content"] == "Look at this\nand this"
    assert body["parts"] == parts


def test_tool_calls_and_results_count_tokens(owner, conversation):
    plain = post(owner, conversation, {"role": "assistant", "content": "", "completed": False}).json()
    call = post(
        owner,
        conversation,
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "c1", "name": "search", "arguments": {"q": "weather in Paris"}}
            ],
        },
    ).json()
    assert call["token_count"] > plain["token_count"]
    result = post(
        owner,
        conversation,
        {
            "role": "tool",
            "parts": [{"type": "tool_result", "tool_call_id": "c1", "content": "Sunny, 24 degrees"}],
        },
    ).json()
    assert result["token_count"] == count_message(role="tool", content="", extra_text="Sunny, 24 degrees")


def test_batch_is_all_or_nothing(owner, conversation):
    batch = {"messages": [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]}
    response = post(owner, conversation, batch)
    assert response.status_code == 201
    assert [m["seq"] for m in response.json()["messages"]] == [1, 2]

    bad = {"messages": [{"role": "user", "content": "three"}, {"role": "robot", "content": "four"}]}
    response = post(owner, conversation, bad)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_role"
    assert response.json()["error"]["message"].startswith("messages.1.role")
    assert Message.objects.filter(conversation=conversation).count() == 2

    too_big = {"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "x" * 300_000}]}
    response = post(owner, conversation, too_big)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "message_too_large"
    assert response.json()["error"]["extra"]["index"] == 1
    assert Message.objects.filter(conversation=conversation).count() == 2


def test_batch_size_limit(owner, conversation, settings):
    settings.MNEMO_MAX_BATCH_MESSAGES = 3
    response = post(
        owner, conversation, {"messages": [{"role": "user", "content": str(i)} for i in range(4)]}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "batch_too_large"
    assert not Message.objects.exists()


def test_message_size_limit_is_configurable(owner, conversation, settings):
    settings.MNEMO_MAX_MESSAGE_BYTES = 10
    response = post(owner, conversation, {"role": "user", "content": "ééééééé"})  # 14 bytes in UTF-8
    assert response.status_code == 400
    assert response.json()["error"]["extra"] == {"index": 0, "size_bytes": 14, "limit_bytes": 10}


def test_request_body_limit(owner, conversation, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    response = post(owner, conversation, {"role": "user", "content": "y" * 5000})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert not Message.objects.exists()


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"role": "wizard", "content": "x"}, "invalid_role"),
        ({"content": "x"}, "required"),
        ({"role": "user", "content": "x", "kind": "compact_summary"}, "invalid_kind"),
        ({"role": "user", "content": "x", "kind": "nonsense"}, "invalid_kind"),
        ({"role": "user", "content": "x", "colour": "red"}, "unknown_field"),
        ({"role": "user", "parts": "text"}, "invalid_parts"),
        ({"role": "user", "parts": [{"type": "video", "url": "x"}]}, "invalid_parts"),
        ({"role": "user", "parts": [{"type": "text"}]}, "invalid_parts"),
        ({"role": "user", "parts": [{"type": "text", "text": 5}]}, "invalid_parts"),
        ({"role": "user", "parts": [{"type": "text", "text": "a", "extra": 1}]}, "invalid_parts"),
        ({"role": "user", "parts": [{"type": "image", "image_id": "../etc/passwd"}]}, "invalid_parts"),
        (
            {"role": "user", "parts": [{"type": "image", "image_id": "img_abc123", "detail": "ultra"}]},
            "invalid_parts",
        ),
        ({"role": "assistant", "parts": [{"type": "tool_call", "id": "1", "name": "f"}]}, "invalid_parts"),
        ({"role": "user", "content": "x", "metadata": "nope"}, "invalid_metadata"),
        ({"role": "user", "content": "x", "turn_id": "not-a-uuid"}, "invalid"),
        ({"role": "user", "content": None}, "null"),
        ({"role": "user"}, "empty_message"),
        ({"role": "user", "content": ""}, "empty_message"),
        ({"messages": []}, "empty"),
        ({"messages": "no"}, "not_a_list"),
    ],
)
def test_bad_input_is_a_400_with_a_code_and_stores_nothing(owner, conversation, payload, code):
    response = post(owner, conversation, payload)
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["code"] == code
    assert not Message.objects.exists()


def test_unknown_turn_and_parent_are_refused(owner, conversation, outsider_conversation):
    foreign_turn = Turn.objects.create(conversation=outsider_conversation, index=1)
    response = post(owner, conversation, {"role": "user", "content": "x", "turn_id": str(foreign_turn.id)})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_turn"
    foreign = Message.objects.create(conversation=outsider_conversation, seq=1, role="user", content="secret")
    response = post(owner, conversation, {"role": "user", "content": "x", "parent_id": str(foreign.id)})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_parent"
    assert not Message.objects.filter(conversation=conversation).exists()


def test_idempotency_header_retry_returns_the_original(owner, conversation):
    first = post(owner, conversation, {"role": "user", "content": "hello"}, **{"Idempotency-Key": "req-1"})
    retry = post(owner, conversation, {"role": "user", "content": "hello"}, **{"Idempotency-Key": "req-1"})
    assert (first.status_code, retry.status_code) == (201, 200)
    assert retry.json() == first.json()
    assert Message.objects.filter(conversation=conversation).count() == 1


def test_idempotency_field_and_conflicting_reuse(owner, conversation):
    post(owner, conversation, {"role": "user", "content": "hello", "idempotency_key": "k"})
    response = post(owner, conversation, {"role": "user", "content": "different", "idempotency_key": "k"})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_conflict"
    assert Message.objects.filter(conversation=conversation).count() == 1
    response = post(
        owner,
        conversation,
        {"role": "user", "content": "x", "idempotency_key": "a"},
        **{"Idempotency-Key": "b"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "idempotency_key_mismatch"


def test_idempotency_keys_are_per_conversation(owner, conversation):
    other = owner.client.post("/api/v1/conversations", {}, format="json").json()
    post(owner, conversation, {"role": "user", "content": "hi"}, **{"Idempotency-Key": "same"})
    response = owner.client.post(
        f"/api/v1/conversations/{other['id']}/messages",
        {"role": "user", "content": "hi"},
        format="json",
        headers={"Idempotency-Key": "same"},
    )
    assert response.status_code == 201


def test_batch_retry_with_header_replays_whole_batch(owner, conversation):
    batch = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    first = post(owner, conversation, batch, **{"Idempotency-Key": "batch-1"})
    retry = post(owner, conversation, batch, **{"Idempotency-Key": "batch-1"})
    assert (first.status_code, retry.status_code) == (201, 200)
    assert [m["idempotency_key"] for m in first.json()["messages"]] == ["batch-1:0", "batch-1:1"]
    assert retry.json() == first.json()
    assert Message.objects.count() == 2
    dup = {"messages": [{"role": "user", "content": "a", "idempotency_key": "z"}] * 2}
    response = post(owner, conversation, dup)
    assert response.json()["error"]["code"] == "duplicate_idempotency_key"
    assert Message.objects.count() == 2


def test_list_with_after_seq_and_limit(owner, conversation):
    post(owner, conversation, {"messages": [{"role": "user", "content": f"m{i}"} for i in range(5)]})
    page = owner.client.get(url(conversation), {"after_seq": 1, "limit": 2}).json()
    assert [m["seq"] for m in page["messages"]] == [2, 3]
    assert (page["next_after_seq"], page["has_more"]) == (3, True)
    page = owner.client.get(url(conversation), {"after_seq": 3, "limit": 10}).json()
    assert [m["content"] for m in page["messages"]] == ["m3", "m4"]
    assert page["has_more"] is False
    for params in ({"after_seq": -1}, {"limit": 0}, {"limit": 5000}, {"after_seq": "x"}):
        response = owner.client.get(url(conversation), params)
        assert response.status_code == 400
        assert response.json()["error"]["code"] in {"min_value", "max_value", "invalid"}


def test_patch_completes_and_amends_only_incomplete_messages(owner, conversation):
    partial = post(
        owner, conversation, {"role": "assistant", "content": "The answer is", "completed": False}
    ).json()
    detail = url(conversation, f"/{partial['id']}")
    response = owner.client.patch(detail, {"content": "The answer is 42."}, format="json")
    assert response.status_code == 200
    assert response.json()["token_count"] == count_message(role="assistant", content="The answer is 42.")
    response = owner.client.patch(detail, {"completed": True}, format="json")
    assert response.json()["completed"] is True
    for payload in ({"content": "changed"}, {"completed": False}, {"parts": []}):
        response = owner.client.patch(detail, payload, format="json")
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "message_completed"
    assert Message.objects.get(pk=partial["id"]).content == "The answer is 42."
    # Metadata stays editable on a completed message.
    assert owner.client.patch(detail, {"metadata": {"rating": 5}}, format="json").status_code == 200


def test_patch_bad_input(owner, conversation):
    message = post(owner, conversation, {"role": "user", "content": "x", "completed": False}).json()
    detail = url(conversation, f"/{message['id']}")
    for payload, code in (
        ({"role": "assistant"}, "unknown_field"),
        ({"parts": [{"type": "nope"}]}, "invalid_parts"),
        ({"completed": "perhaps"}, "invalid"),
    ):
        response = owner.client.patch(detail, payload, format="json")
        assert response.status_code == 400
        assert response.json()["error"]["code"] == code
    assert Message.objects.get(pk=message["id"]).completed is False


def test_outsider_cannot_touch_messages(owner, outsider, conversation):
    message = post(owner, conversation, {"role": "user", "content": "secret"}).json()
    assert post(outsider, conversation, {"role": "user", "content": "inject"}).status_code == 404
    assert outsider.client.get(url(conversation)).status_code == 404
    assert outsider.client.get(url(conversation, f"/{message['id']}")).status_code == 404
    response = outsider.client.patch(
        url(conversation, f"/{message['id']}"), {"completed": True}, format="json"
    )
    assert response.status_code == 404
    assert Message.objects.filter(conversation=conversation).count() == 1


def test_message_of_another_conversation_is_404(owner, conversation):
    other = owner.client.post("/api/v1/conversations", {}, format="json").json()
    message = post(owner, conversation, {"role": "user", "content": "x"}).json()
    response = owner.client.get(f"/api/v1/conversations/{other['id']}/messages/{message['id']}")
    assert response.status_code == 404


def test_anonymous_gets_401(anonymous, conversation):
    assert (
        anonymous.post(url(conversation), {"role": "user", "content": "x"}, format="json").status_code == 401
    )
    assert anonymous.get(url(conversation)).status_code == 401
