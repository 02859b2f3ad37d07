"""The client's time on messages: `created_at` on a single append, on each item of a batch and in a
transcript import; validated, stored in UTC, default now. Order stays by seq; created_at is data."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from conversations.models import Conversation, Message

pytestmark = pytest.mark.django_db

IMPORT_URL = "/api/v1/conversations/import"


def url(conversation):
    return f"/api/v1/conversations/{conversation.id}/messages"


def post(actor, conversation, payload, **headers):
    return actor.client.post(url(conversation), payload, format="json", headers=headers)


def stored(conversation):
    return list(Message.objects.filter(conversation=conversation).order_by("seq"))


def future(**delta) -> str:
    return (timezone.now() + timedelta(**delta)).isoformat()


# --- single and batch appends ------------------------------------------------------------------------------


def test_a_single_append_stores_and_returns_the_clients_time(owner, conversation):
    response = post(
        owner, conversation, {"role": "user", "content": "hi", "created_at": "2024-03-15T10:30:00+02:00"}
    )
    assert response.status_code == 201, response.json()
    # Stored and answered in UTC, whatever offset the client wrote.
    assert response.json()["created_at"] == "2024-03-15T08:30:00Z"
    [message] = stored(conversation)
    assert message.created_at == datetime(2024, 3, 15, 8, 30, tzinfo=UTC)
    listed = owner.client.get(url(conversation)).json()["messages"]
    assert listed[0]["created_at"] == "2024-03-15T08:30:00Z"
    assert listed[0] == response.json()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param("2024-03-15", datetime(2024, 3, 15, tzinfo=UTC), id="date-only-is-midnight-utc"),
        pytest.param("2024-03-15T10:30:00", datetime(2024, 3, 15, 10, 30, tzinfo=UTC), id="naive-is-utc"),
        pytest.param("2024-03-15T10:30:00Z", datetime(2024, 3, 15, 10, 30, tzinfo=UTC), id="z"),
        pytest.param(
            "2024-03-15T10:30:00.123456-05:00",
            datetime(2024, 3, 15, 15, 30, 0, 123456, tzinfo=UTC),
            id="microseconds-and-negative-offset",
        ),
        pytest.param("1970-01-01T00:00:00Z", datetime(1970, 1, 1, tzinfo=UTC), id="the-epoch-itself"),
    ],
)
def test_accepted_formats(owner, conversation, given, expected):
    response = post(owner, conversation, {"role": "user", "content": "x", "created_at": given})
    assert response.status_code == 201, response.json()
    assert stored(conversation)[0].created_at == expected


def test_a_client_clock_some_hours_ahead_is_accepted(owner, conversation):
    response = post(owner, conversation, {"role": "user", "content": "x", "created_at": future(hours=20)})
    assert response.status_code == 201, response.json()


def test_without_created_at_the_default_is_now(owner, conversation):
    before = timezone.now()
    single = post(owner, conversation, {"role": "user", "content": "now"})
    batch = post(owner, conversation, {"messages": [{"role": "assistant", "content": "also now"}]})
    after = timezone.now()
    assert (single.status_code, batch.status_code) == (201, 201)
    assert all(before <= m.created_at <= after for m in stored(conversation))


def test_the_conversation_is_updated_now_not_at_the_clients_time(owner, conversation):
    before = timezone.now()
    post(owner, conversation, {"role": "user", "content": "old", "created_at": "2020-01-01T00:00:00Z"})
    post(
        owner, conversation, {"messages": [{"role": "user", "content": "older", "created_at": "2019-01-01"}]}
    )
    conversation.refresh_from_db()
    assert conversation.updated_at >= before


def test_a_batch_takes_each_items_time_and_may_go_back_in_time(owner, conversation):
    post(owner, conversation, {"role": "user", "content": "newest first"})
    batch = {
        "messages": [
            {"role": "user", "content": "a", "created_at": "2023-05-01T09:00:00Z"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c", "created_at": "2021-05-01T09:00:00+01:00"},
        ]
    }
    before = timezone.now()
    response = post(owner, conversation, batch)
    assert response.status_code == 201, response.json()
    body = response.json()["messages"]
    assert [m["seq"] for m in body] == [2, 3, 4]  # seq stays the order, whatever the times say
    assert body[0]["created_at"] == "2023-05-01T09:00:00Z"
    assert body[2]["created_at"] == "2021-05-01T08:00:00Z"
    messages = stored(conversation)
    assert [m.content for m in messages] == ["newest first", "a", "b", "c"]
    assert messages[1].created_at == datetime(2023, 5, 1, 9, tzinfo=UTC)
    assert messages[2].created_at >= before  # the item without a time gets now
    assert messages[3].created_at == datetime(2021, 5, 1, 8, tzinfo=UTC)
    listed = owner.client.get(url(conversation)).json()["messages"]
    assert [m["content"] for m in listed] == ["newest first", "a", "b", "c"]


# --- refusals ----------------------------------------------------------------------------------------------

BAD_TIMES = [
    pytest.param("yesterday", "invalid_created_at", id="not-a-time"),
    pytest.param("", "invalid_created_at", id="empty"),
    pytest.param("2024-13-45T00:00:00Z", "invalid_created_at", id="impossible-date"),
    pytest.param("2024-03-15T25:00:00Z", "invalid_created_at", id="impossible-hour"),
    pytest.param("2024-03-15T10:00:00+25:00", "invalid_created_at", id="impossible-offset"),
    pytest.param(" 2024-03-15", "invalid_created_at", id="padded"),
    pytest.param(1710496200, "invalid_created_at", id="a-number"),
    pytest.param(["2024-03-15"], "invalid_created_at", id="a-list"),
    pytest.param(True, "invalid_created_at", id="a-boolean"),
    pytest.param(None, "null", id="null"),
    pytest.param("1969-12-31T23:59:59Z", "created_at_out_of_range", id="before-1970"),
    pytest.param("1970-01-01T00:30:00+01:00", "created_at_out_of_range", id="before-1970-by-its-offset"),
    pytest.param("0001-01-01T00:00:00+01:00", "created_at_out_of_range", id="year-1-with-offset"),
    pytest.param("9999-12-31T23:00:00-05:00", "created_at_out_of_range", id="year-9999-with-offset"),
    pytest.param("2124-03-15", "created_at_out_of_range", id="a-century-ahead"),
]


@pytest.mark.parametrize(("value", "code"), BAD_TIMES)
def test_a_bad_time_is_a_400_naming_created_at_and_stores_nothing(owner, conversation, value, code):
    response = post(owner, conversation, {"role": "user", "content": "x", "created_at": value})
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"].startswith("created_at: ")
    assert [e["code"] for e in error["extra"]["fields"]["created_at"]] == [code]
    assert not Message.objects.exists()
    conversation.refresh_from_db()
    assert conversation.last_seq == 0


def test_more_than_a_day_ahead_is_refused(owner, conversation):
    response = post(
        owner, conversation, {"role": "user", "content": "x", "created_at": future(days=1, hours=1)}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "created_at_out_of_range"
    assert not Message.objects.exists()


def test_one_bad_item_refuses_the_whole_batch_and_names_its_index(owner, conversation):
    batch = {
        "messages": [
            {"role": "user", "content": "fine", "created_at": "2024-03-15T10:00:00Z"},
            {"role": "assistant", "content": "fine too"},
            {"role": "user", "content": "bad", "created_at": "1969-07-20T20:17:40Z"},
        ]
    }
    response = post(owner, conversation, batch)
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["code"] == "created_at_out_of_range"
    reason = "Must not be before 1970-01-01T00:00:00Z."
    assert error["message"] == f"messages.2.created_at: {reason}"
    assert error["extra"]["fields"] == {
        "messages": {"2": {"created_at": [{"code": "created_at_out_of_range", "message": reason}]}}
    }
    assert not Message.objects.exists()
    conversation.refresh_from_db()
    assert conversation.last_seq == 0


# --- replays -----------------------------------------------------------------------------------------------


def test_a_replay_with_the_same_time_answers_the_original(owner, conversation):
    payload = {"role": "user", "content": "hello", "created_at": "2024-03-15T10:00:00Z"}
    first = post(owner, conversation, payload, **{"Idempotency-Key": "r-1"})
    retry = post(owner, conversation, payload, **{"Idempotency-Key": "r-1"})
    assert (first.status_code, retry.status_code) == (201, 200)
    assert retry.json() == first.json()
    assert len(stored(conversation)) == 1


def test_a_replay_with_another_time_is_the_same_message_and_keeps_the_original_time(owner, conversation):
    # Like metadata and flags, created_at is not what the message says: a client that stamps each retry
    # with its own clock must get its original back, not a 409.
    first = post(
        owner,
        conversation,
        {"role": "user", "content": "hello", "created_at": "2024-03-15T10:00:00Z"},
        **{"Idempotency-Key": "r-2"},
    )
    for retried in ("2024-03-15T10:00:05Z", None):
        payload = {"role": "user", "content": "hello"} | ({"created_at": retried} if retried else {})
        retry = post(owner, conversation, payload, **{"Idempotency-Key": "r-2"})
        assert retry.status_code == 200, retry.json()
        assert retry.json() == first.json()
        assert retry.json()["created_at"] == "2024-03-15T10:00:00Z"
    batch = {"messages": [{"role": "user", "content": "hello", "created_at": "2025-01-01"}]}
    retry = post(owner, conversation, batch, **{"Idempotency-Key": "r-2"})
    assert retry.status_code == 200
    assert retry.json()["messages"] == [first.json()]
    # Other content under the same key is still a conflict.
    response = post(
        owner,
        conversation,
        {"role": "user", "content": "other", "created_at": "2024-03-15T10:00:00Z"},
        **{"Idempotency-Key": "r-2"},
    )
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_conflict"
    [message] = stored(conversation)
    assert message.created_at == datetime(2024, 3, 15, 10, tzinfo=UTC)


# --- the outsider ------------------------------------------------------------------------------------------


def test_an_outsider_gets_404_and_writes_nothing(owner, outsider, conversation):
    response = post(outsider, conversation, {"role": "user", "content": "x", "created_at": "2024-03-15"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    batch = {"messages": [{"role": "user", "content": "x", "created_at": "2024-03-15"}]}
    assert post(outsider, conversation, batch).status_code == 404
    assert not Message.objects.exists()


def test_the_outsiders_import_lands_in_its_own_tenant_with_its_times(owner, outsider):
    line = {
        "uuid": "a",
        "parentUuid": None,
        "role": "user",
        "content": "x",
        "timestamp": "2022-02-02T02:02:02Z",
    }
    response = outsider.client.post(
        IMPORT_URL, data=json.dumps(line).encode(), content_type="application/x-ndjson"
    )
    assert response.status_code == 201
    imported = Conversation.objects.get(pk=response.json()["id"])
    assert imported.tenant_id == outsider.tenant.id
    assert owner.client.get(f"/api/v1/conversations/{imported.id}/messages").status_code == 404


# --- transcript import -------------------------------------------------------------------------------------


def import_lines(client, *lines):
    body = b"\n".join(json.dumps(line).encode() for line in lines)
    return client.post(IMPORT_URL, data=body, content_type="application/x-ndjson")


def test_import_keeps_the_files_timestamps_even_out_of_order(owner):
    header = {"type": "conversation", "version": 1, "title": "dated", "model": "gpt-4o", "turns": []}
    lines = [
        {
            "uuid": "a",
            "parentUuid": None,
            "role": "user",
            "content": "1",
            "timestamp": "2024-03-15T10:00:00+02:00",
        },
        {"uuid": "b", "parentUuid": "a", "role": "assistant", "content": "2", "timestamp": "2023-01-01"},
        {"uuid": "c", "parentUuid": "b", "role": "user", "content": "3", "timestamp": "2024-03-15T10:00:00"},
        {"uuid": "d", "parentUuid": "c", "role": "assistant", "content": "4"},
    ]
    before = timezone.now()
    response = import_lines(owner.client, header, *lines)
    assert response.status_code == 201, response.json()
    messages = list(Message.objects.filter(conversation_id=response.json()["id"]).order_by("seq"))
    assert [m.content for m in messages] == ["1", "2", "3", "4"]
    assert [m.created_at for m in messages[:3]] == [
        datetime(2024, 3, 15, 8, tzinfo=UTC),
        datetime(2023, 1, 1, tzinfo=UTC),
        datetime(2024, 3, 15, 10, tzinfo=UTC),
    ]
    assert messages[3].created_at >= before  # no timestamp: now


@pytest.mark.parametrize(
    "timestamp",
    [
        pytest.param("1969-12-31T23:59:59Z", id="before-1970"),
        pytest.param(-1000, id="negative-epoch-milliseconds"),
        pytest.param("2124-03-15T00:00:00Z", id="a-century-ahead"),
        pytest.param("9999-12-31T23:00:00-05:00", id="year-9999-with-offset"),
    ],
)
def test_import_refuses_a_timestamp_out_of_range_and_stores_nothing(owner, timestamp):
    good = {"uuid": "a", "parentUuid": None, "role": "user", "content": "1", "timestamp": "2024-03-15"}
    bad = {"uuid": "b", "parentUuid": "a", "role": "user", "content": "2", "timestamp": timestamp}
    before = (Conversation.objects.count(), Message.objects.count())
    response = import_lines(owner.client, good, bad)
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert (error["code"], error["extra"]["line"]) == ("invalid_transcript", 2)
    assert "timestamp" in error["message"]
    assert (Conversation.objects.count(), Message.objects.count()) == before


def test_client_times_survive_export_import_export_byte_for_byte(owner, conversation):
    batch = {
        "messages": [
            {"role": "user", "content": "a", "created_at": "2024-03-15T10:00:00.5+02:00"},
            {"role": "assistant", "content": "b", "created_at": "2020-02-29"},
            {"role": "user", "content": "c"},
        ]
    }
    assert post(owner, conversation, batch).status_code == 201
    export_url = f"/api/v1/conversations/{conversation.id}/transcript.jsonl"
    original = b"".join(owner.client.get(export_url).streaming_content)
    timestamps = [json.loads(line).get("timestamp") for line in original.splitlines()[1:]]
    assert timestamps[:2] == ["2024-03-15T08:00:00.500000Z", "2020-02-29T00:00:00.000000Z"]

    response = owner.client.post(IMPORT_URL, data=original, content_type="application/x-ndjson")
    assert response.status_code == 201, response.json()
    imported = Conversation.objects.get(pk=response.json()["id"])
    again = b"".join(
        owner.client.get(f"/api/v1/conversations/{imported.id}/transcript.jsonl").streaming_content
    )
    expected = original.replace(str(conversation.id).encode(), str(imported.id).encode())
    old_ids = [str(m.id) for m in stored(conversation)]
    new_ids = [str(m.id) for m in stored(imported)]
    for old, new in zip(old_ids, new_ids, strict=True):
        expected = expected.replace(old.encode(), new.encode())
    assert again == expected
