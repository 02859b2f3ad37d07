"""OpenAI's message `name` through the chat proxy, with the real `openai` client: stored with each message,
listed among the conversation's participants, and a bad one refused before anything is stored or sent."""

import openai
import pytest

from conversations.models import Message
from tests.proxy.conftest import wait_for
from tests.proxy.test_bad_input import nothing_happened
from tests.proxy.test_openai_proxy import ask, client

pytestmark = pytest.mark.django_db(transaction=True)  # the server reads and writes on its own thread


def speakers(conversation_id) -> list[tuple[str, str, str]]:
    return list(
        Message.objects.filter(conversation_id=conversation_id)
        .order_by("seq")
        .values_list("role", "name", "content")
    )


GROUP_CHAT = [
    {"role": "system", "name": "house-rules", "content": "Keep it short."},
    {"role": "user", "name": "alice", "content": "Do we ship on Friday?"},
    {"role": "assistant", "name": "moderator", "content": "Bob, your call?"},
    {"role": "user", "name": "bob", "content": "Only if the tests pass."},
]


def test_names_are_stored_with_each_message_and_the_list_resent_appends_only_the_new(
    owner, mnemo_url, llm_server
):
    llm_server.reply = "They pass."
    _, conversation_id = ask(client(mnemo_url, owner.raw_key), GROUP_CHAT)
    # The system message joins the client's system text: no one's turn, so its name is not kept.
    assert speakers(conversation_id) == [
        ("user", "alice", "Do we ship on Friday?"),
        ("assistant", "moderator", "Bob, your call?"),
        ("user", "bob", "Only if the tests pass."),
        ("assistant", "", "They pass."),
    ]

    llm_server.reply = "Friday it is."
    following = [
        *GROUP_CHAT,
        {"role": "assistant", "content": "They pass."},
        {"role": "user", "name": " carol ", "content": "Then Friday."},
    ]
    sdk = client(mnemo_url, owner.raw_key, **{"X-Mnemo-Conversation": conversation_id})
    ask(sdk, following)
    assert wait_for(lambda: len(speakers(conversation_id)) == 6)
    assert speakers(conversation_id)[4:] == [
        ("user", "carol", "Then Friday."),
        ("assistant", "", "Friday it is."),
    ]

    detail = owner.client.get(f"/api/v1/conversations/{conversation_id}").json()
    assert detail["participants"] == [
        {"name": None, "role": "assistant", "messages": 2},
        {"name": "moderator", "role": "assistant", "messages": 1},
        {"name": "alice", "role": "user", "messages": 1},
        {"name": "bob", "role": "user", "messages": 1},
        {"name": "carol", "role": "user", "messages": 1},
    ]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("x" * 65, id="65-characters"),
        pytest.param("bell\x07", id="control"),
        pytest.param(42, id="number"),
    ],
)
def test_a_bad_name_is_a_400_in_openais_shape_and_nothing_is_stored_or_sent(
    owner, mnemo_url, llm_server, name
):
    messages = [
        {"role": "user", "name": "alice", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "name": name, "content": "and me"},
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client(mnemo_url, owner.raw_key), messages)
    error = refused.value.response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_name",
        "messages.2.name",
    )
    nothing_happened(owner, llm_server)
