"""Speakers' names on messages: stored and returned through a single append, a batch and a transcript, refused
(stored nowhere) when they are not a name, and summed up in a conversation's participants."""

import json

import pytest
from django.db import connection

from conversations.models import Conversation, Message
from conversations.selectors import conversation_participants
from conversations.services import compaction_records_append, message_append_batch, message_update
from providers.tokens import count_message
from tenants.errors import ApplicationError
from tests.conversations.transcripts import export, import_transcript, lines_of

pytestmark = pytest.mark.django_db

BAD_NAMES = [
    pytest.param("x" * 65, id="65-characters"),
    pytest.param("bell\x07", id="control-character"),
    pytest.param("ali\u202ece", id="bidi-override"),
    pytest.param("two\nlines", id="newline"),
    pytest.param("para\u2029graph", id="paragraph-separator"),
    pytest.param(42, id="number"),
    pytest.param(["alice"], id="list"),
    pytest.param({"first": "alice"}, id="object"),
    pytest.param(True, id="boolean"),
]


def messages_url(conversation) -> str:
    return f"/api/v1/conversations/{conversation.id}/messages"


def post(actor, conversation, payload, **headers):
    return actor.client.post(messages_url(conversation), payload, format="json", headers=headers)


def stored_names(conversation) -> list[str]:
    return list(
        Message.objects.filter(conversation=conversation).order_by("seq").values_list("name", flat=True)
    )


# --- input and output ------------------------------------------------------------------------------------


def test_a_single_append_stores_the_name_trimmed_and_returns_it(owner, conversation):
    response = post(owner, conversation, {"role": "user", "name": "  Alice Martin ", "content": "Hello all."})
    assert response.status_code == 201, response.content
    assert response.json()["name"] == "Alice Martin"
    assert stored_names(conversation) == ["Alice Martin"]
    # The name is part of what the model reads (OpenAI counts it), so of the token count stored once.
    expected = count_message(role="user", content="Hello all.", name="Alice Martin", model="gpt-4o")
    assert response.json()["token_count"] == expected
    listed = owner.client.get(messages_url(conversation)).json()["messages"]
    assert [m["name"] for m in listed] == ["Alice Martin"]
    one = owner.client.get(f"{messages_url(conversation)}/{response.json()['id']}").json()
    assert one["name"] == "Alice Martin"


@pytest.mark.parametrize("given", [{}, {"name": ""}, {"name": "   "}, {"name": None}])
def test_no_name_is_stored_empty_and_read_as_null(owner, conversation, given):
    response = post(owner, conversation, {"role": "user", "content": "hi", **given})
    assert response.status_code == 201, response.content
    assert response.json()["name"] is None
    assert stored_names(conversation) == [""]


def test_sixty_four_characters_and_any_script_are_a_name(owner, conversation):
    names = ["n" * 64, "Zoë 李雷", "agent-7_planner", "👩 dev"]
    batch = {"messages": [{"role": "user", "name": name, "content": f"from {name}"} for name in names]}
    response = post(owner, conversation, batch)
    assert response.status_code == 201, response.content
    assert [m["name"] for m in response.json()["messages"]] == names
    assert stored_names(conversation) == names


def test_a_batch_stores_each_message_s_name(owner, conversation):
    batch = {
        "messages": [
            {"role": "user", "name": "alice", "content": "Shall we ship on Friday?"},
            {"role": "user", "name": "bob", "content": "Only if the tests pass."},
            {"role": "assistant", "content": "I will run them."},
            {"role": "assistant", "name": "release-bot", "content": "All green."},
        ]
    }
    response = post(owner, conversation, batch)
    assert response.status_code == 201, response.content
    assert [m["name"] for m in response.json()["messages"]] == ["alice", "bob", None, "release-bot"]
    assert stored_names(conversation) == ["alice", "bob", "", "release-bot"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_bad_name_is_a_400_with_the_field_s_code_and_stores_nothing(owner, conversation, name):
    response = post(owner, conversation, {"role": "user", "name": name, "content": "hi"})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_name"
    assert error["message"].startswith("name: ")
    assert error["extra"]["fields"]["name"][0]["code"] == "invalid_name"
    assert not Message.objects.filter(conversation=conversation).exists()


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_batch_with_one_bad_name_stores_none_of_it(owner, conversation, name):
    batch = {
        "messages": [
            {"role": "user", "name": "alice", "content": "first"},
            {"role": "user", "name": name, "content": "second"},
        ]
    }
    response = post(owner, conversation, batch)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_name"
    assert error["message"].startswith("messages.1.name: ")
    assert error["extra"]["fields"]["messages"]["1"]["name"][0]["code"] == "invalid_name"
    assert not Message.objects.filter(conversation=conversation).exists()
    conversation.refresh_from_db()
    assert conversation.last_seq == 0


def test_the_service_checks_names_for_callers_other_than_the_api(conversation):
    """The proxy and other callers reach message_append_batch without the API's serializer."""
    items = [
        {"role": "user", "name": "ok", "content": "a"},
        {"role": "user", "name": "bad\x07", "content": "b"},
    ]
    with pytest.raises(ApplicationError) as refused:
        message_append_batch(conversation=conversation, items=items)
    assert (refused.value.code, refused.value.extra) == ("invalid_name", {"index": 1})
    assert not Message.objects.filter(conversation=conversation).exists()


def test_a_replay_with_another_speaker_is_a_conflict_not_the_original(owner, conversation):
    first = post(
        owner, conversation, {"role": "user", "name": "alice", "content": "yes"}, **{"Idempotency-Key": "k"}
    )
    again = post(
        owner, conversation, {"role": "user", "name": "alice", "content": "yes"}, **{"Idempotency-Key": "k"}
    )
    other = post(
        owner, conversation, {"role": "user", "name": "bob", "content": "yes"}, **{"Idempotency-Key": "k"}
    )
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
    assert again.json()["id"] == first.json()["id"]
    assert other.json()["error"]["code"] == "idempotency_conflict"
    assert stored_names(conversation) == ["alice"]


def test_amending_an_unfinished_message_keeps_its_name_in_the_token_count(conversation):
    [result] = message_append_batch(
        conversation=conversation,
        items=[{"role": "assistant", "name": "planner", "content": "", "completed": False}],
    )
    updated = message_update(message=result.message, content="Step one: read the logs.", completed=True)
    assert updated.name == "planner"
    assert updated.token_count == count_message(
        role="assistant", content="Step one: read the logs.", name="planner", model="gpt-4o"
    )


def test_the_schema_documents_name_and_participants(anonymous):
    schemas = anonymous.get("/api/schema/", {"format": "json"}).json()["components"]["schemas"]
    assert schemas["MessageInputRequest"]["properties"]["name"]["maxLength"] == 64
    assert schemas["MessageOutput"]["properties"]["name"]["nullable"] is True
    assert "name" in schemas["MessageOutput"]["required"]
    participants = schemas["ConversationDetailOutput"]["properties"]["participants"]
    assert participants["items"]["$ref"].endswith("/Participant")
    assert set(schemas["Participant"]["properties"]) == {"name", "role", "messages"}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement append is PostgreSQL's")
def test_the_one_statement_append_writes_the_name(conversation):
    [result] = message_append_batch(
        conversation=conversation, items=[{"role": "user", "name": "alice", "content": "hi"}]
    )
    assert Message.objects.get(pk=result.message.pk).name == "alice"


# --- participants ----------------------------------------------------------------------------------------


def _chat(conversation: Conversation) -> None:
    said = [
        ("user", "alice", 3),
        ("user", "bob", 1),
        ("assistant", "", 2),
        ("assistant", "planner", 2),
        ("tool", "", 1),
    ]
    items = [
        {"role": role, "name": name, "content": f"{name or role} #{n}"}
        for role, name, count in said
        for n in range(count)
    ]
    message_append_batch(conversation=conversation, items=items)
    # Compaction's records are nobody's words.
    compaction_records_append(
        conversation=conversation,
        records=[
            {"role": "system", "kind": Message.Kind.COMPACT_BOUNDARY, "content": "Conversation compacted"},
            {"role": "user", "kind": Message.Kind.COMPACT_SUMMARY, "content": "alice and bob talked."},
        ],
    )


def test_a_conversation_lists_its_participants_with_their_counts(owner, conversation):
    _chat(conversation)
    response = owner.client.get(f"/api/v1/conversations/{conversation.id}")
    assert response.status_code == 200
    assert response.json()["participants"] == [
        {"name": "alice", "role": "user", "messages": 3},
        {"name": None, "role": "assistant", "messages": 2},
        {"name": "planner", "role": "assistant", "messages": 2},
        {"name": None, "role": "tool", "messages": 1},
        {"name": "bob", "role": "user", "messages": 1},
    ]


def test_participants_are_one_query_and_empty_for_a_new_conversation(conversation, django_assert_num_queries):
    with django_assert_num_queries(1):
        assert conversation_participants(conversation=conversation) == []
    _chat(conversation)
    with django_assert_num_queries(1):
        assert len(conversation_participants(conversation=conversation)) == 5


def test_the_same_name_in_two_roles_is_two_participants(conversation):
    message_append_batch(
        conversation=conversation,
        items=[
            {"role": "user", "name": "sam", "content": "q"},
            {"role": "assistant", "name": "sam", "content": "a"},
        ],
    )
    assert conversation_participants(conversation=conversation) == [
        {"name": "sam", "role": "assistant", "messages": 1},
        {"name": "sam", "role": "user", "messages": 1},
    ]


def test_an_outsider_gets_404_for_the_participants_and_cannot_name_a_speaker(owner, outsider, conversation):
    _chat(conversation)
    assert len(owner.client.get(f"/api/v1/conversations/{conversation.id}").json()["participants"]) == 5
    assert outsider.client.get(f"/api/v1/conversations/{conversation.id}").status_code == 404
    response = post(outsider, conversation, {"role": "user", "name": "mallory", "content": "hi"})
    assert response.status_code == 404
    assert not Message.objects.filter(conversation=conversation, name="mallory").exists()


# --- transcripts -----------------------------------------------------------------------------------------


def test_export_writes_a_name_only_when_set_and_import_reads_it_back(owner, conversation):
    batch = {
        "messages": [
            {"role": "user", "name": "alice", "content": "Who is on call?"},
            {"role": "assistant", "content": "Bob is."},
        ]
    }
    assert post(owner, conversation, batch).status_code == 201
    exported = export(owner.client, conversation.id)
    lines = lines_of(exported)
    assert lines[1]["name"] == "alice"
    assert "name" not in lines[2]

    imported = import_transcript(owner.client, exported)
    assert imported.status_code == 201, imported.content
    copy = Conversation.objects.get(pk=imported.json()["id"])
    assert stored_names(copy) == ["alice", ""]
    first = Message.objects.get(conversation=copy, seq=1)
    assert first.token_count == count_message(
        role="user", content="Who is on call?", name="alice", model="gpt-4o"
    )
    # Export -> import -> export: the same lines but for the ids the import assigns.
    again = lines_of(export(owner.client, copy.id))
    for line in [*lines, *again]:
        for key in ("id", "uuid", "parentUuid"):
            line.pop(key, None)
    assert again == lines


def test_import_trims_a_name_and_takes_an_empty_one_as_none(owner):
    body = "\n".join(
        json.dumps(line)
        for line in [
            {
                "uuid": "a",
                "parentUuid": None,
                "type": "user",
                "role": "user",
                "name": " carol ",
                "content": "hi",
            },
            {
                "uuid": "b",
                "parentUuid": "a",
                "type": "assistant",
                "role": "assistant",
                "name": "",
                "content": "yo",
            },
        ]
    ).encode()
    response = import_transcript(owner.client, body)
    assert response.status_code == 201, response.content
    assert stored_names(Conversation.objects.get(pk=response.json()["id"])) == ["carol", ""]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_import_refuses_a_bad_name_and_creates_nothing(owner, name):
    lines = [
        {"uuid": "a", "parentUuid": None, "type": "user", "role": "user", "name": "alice", "content": "hi"},
        {"uuid": "b", "parentUuid": "a", "type": "user", "role": "user", "name": name, "content": "there"},
    ]
    response = import_transcript(owner.client, "\n".join(json.dumps(line) for line in lines).encode())
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["extra"]) == ("invalid_transcript", {"line": 2})
    assert "name" in error["message"]
    assert not Conversation.objects.filter(tenant=owner.tenant).exists()
    assert not Message.objects.exists()
