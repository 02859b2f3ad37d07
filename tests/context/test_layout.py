"""Layout B1–B6: what goes in the system message, what the current user message carries and in which order,
and how history (tool calls and results included) renders in each provider's format."""

import json

import pytest

from context import sources
from context.services import agent_profile_create
from conversations.models import Message
from prefix_cache.rendering import FORMATS, canonical_json, sha256
from tests.context.helpers import append, context, dumps, install_blocks, item, section

pytestmark = pytest.mark.django_db

B1_TEXT = "You are Deploy bot, responsible for releases.\nPolicy:\nNever deploy on Fridays."


@pytest.fixture
def profile(owner):
    return agent_profile_create(
        tenant=owner.tenant,
        name="Deploy bot",
        scope="releases",
        policy="Never deploy on Fridays.",
        is_default=True,
    )


def all_blocks(monkeypatch, *, retrieved=None):
    install_blocks(
        monkeypatch,
        core_memory=[
            item("persona: Alice is the release manager.", kind="core_memory", label="persona"),
            item("preferences: short answers.", kind="core_memory", label="preferences"),
        ],
        summaries=[
            item("Segment 1: set up CI.", kind="summary", id=1),
            item("Segment 2: fixed flaky tests.", kind="summary", id=2),
        ],
        retrieved=retrieved
        if retrieved is not None
        else [
            item("docs/deploy.md: run make release.", kind="chunk", id="c1", score=0.9),
            item("Earlier: staging was green.", kind="archival", id="a1", score=0.4),
        ],
        task_state=item('{"step": "tag", "version": "2.4.0"}', kind="task_state", epoch=3),
        session_profile=item("Locale: de-DE; timezone Europe/Berlin.", kind="session_profile"),
        memory_updates=[item("Alice now prefers email.", kind="memory_update")],
    )


EXPECTED_SYSTEM = "\n\n".join(
    [
        B1_TEXT,
        section("## Core memory", "persona: Alice is the release manager.", "preferences: short answers."),
        section("## Conversation summary", "Segment 1: set up CI.", "Segment 2: fixed flaky tests."),
    ]
)
EXPECTED_USER = "\n\n".join(
    [
        # Memories first, then the rest (DESIGN.md, Retrieval), whatever their scores.
        section("## Retrieved context", "Earlier: staging was green.", "docs/deploy.md: run make release."),
        section("## Task state", '{"step": "tag", "version": "2.4.0"}'),
        section("## Session profile", "Locale: de-DE; timezone Europe/Berlin."),
        section("## Memory updates", "Alice now prefers email."),
        section("## Attachments and tool output", "- ci.log\n  Last CI run\nall 312 tests passed"),
        section("## User question", "Can we ship 2.4.0 today?"),
    ]
)
ATTACHMENT = {"name": "ci.log", "description": "Last CI run", "content": "all 312 tests passed"}


def test_system_is_b1_b2a_b4_and_the_current_message_carries_the_per_request_blocks_in_order(
    owner, conversation, profile, monkeypatch
):
    all_blocks(monkeypatch)
    append(conversation, {"role": "user", "content": "Status?"}, {"role": "assistant", "content": "Green."})
    body = {"user_message": "Can we ship 2.4.0 today?", "attachments": [ATTACHMENT]}

    openai = context(owner, conversation, **body)
    assert openai["system"] == EXPECTED_SYSTEM
    assert openai["messages"] == [
        {"role": "system", "content": EXPECTED_SYSTEM},
        {"role": "user", "content": "Status?"},
        {"role": "assistant", "content": "Green."},
        {"role": "user", "content": EXPECTED_USER},
    ]
    assert list(openai["blocks"]) == [
        "B1",
        "B2a",
        "B4",
        "B6",
        "B5",
        "B3",
        "B2b",
        "memory_updates",
        "attachments",
        "user",
    ]
    assert openai["blocks"]["B1"]["items"] == [{"kind": "agent_profile", "id": str(profile.id), "version": 1}]
    assert [i["label"] for i in openai["blocks"]["B2a"]["items"]] == ["persona", "preferences"]
    assert [i["id"] for i in openai["blocks"]["B4"]["items"]] == [1, 2]
    assert [i["id"] for i in openai["blocks"]["B5"]["items"]] == ["a1", "c1"]
    assert openai["blocks"]["attachments"]["items"][0]["priority"] == "P0"

    anthropic = context(owner, conversation, **body, format="anthropic")
    assert anthropic["system"] == [
        {"type": "text", "text": EXPECTED_SYSTEM, "cache_control": {"type": "ephemeral"}}
    ]
    assert anthropic["messages"][-1] == {"role": "user", "content": [{"type": "text", "text": EXPECTED_USER}]}

    gemini = context(owner, conversation, **body, format="gemini")
    assert gemini["system"] == {"parts": [{"text": EXPECTED_SYSTEM}]}
    assert gemini["messages"][-1] == {"role": "user", "parts": [{"text": EXPECTED_USER}]}


def test_without_per_request_blocks_the_current_message_is_exactly_the_users_text(
    owner, conversation, profile
):
    text = "  ## User question\nkeep   my spacing\n\n"
    for fmt, expected in [
        ("openai", {"role": "user", "content": text}),
        ("anthropic", {"role": "user", "content": [{"type": "text", "text": text}]}),
        ("gemini", {"role": "user", "parts": [{"text": text}]}),
    ]:
        body = context(owner, conversation, user_message=text, format=fmt)
        assert body["messages"][-1] == expected
        assert set(body["blocks"]) == {"B1", "user"}


def test_the_fake_blocks_are_gone_after_the_test_that_installed_them():
    # monkeypatch restores the source: no test leaks blocks into another.
    assert sources.load_core_memory.__module__ == "context.sources"


def test_without_a_profile_or_blocks_there_is_no_system_message(owner, conversation):
    for fmt in FORMATS:
        body = context(owner, conversation, user_message="Hi", format=fmt)
        assert body["system"] in ("", [], None)
        assert len(body["messages"]) == 1
        assert "B1" not in body["blocks"]


def test_retrieved_items_already_in_the_history_are_left_out(owner, conversation, profile, monkeypatch):
    [_question, answer] = append(
        conversation,
        {"role": "user", "content": "Which port?"},
        {"role": "assistant", "content": "Port 8443."},
    )
    all_blocks(
        monkeypatch,
        retrieved=[
            item("Port 8443.", kind="message", id=str(answer.id), score=0.99),
            item("runbook: restart with systemctl.", kind="chunk", id="c9", score=0.5),
        ],
    )
    body = context(owner, conversation, user_message="And the host?")
    assert [i["id"] for i in body["blocks"]["B5"]["items"]] == ["c9"]
    assert body["messages"][-1]["content"].startswith(
        "## Retrieved context\nrunbook: restart with systemctl.\n\n"
    )
    assert body["dropped"] == []


def test_retrieved_context_shows_memories_first_then_messages_in_the_order_they_were_said(
    owner, conversation, profile, monkeypatch
):
    all_blocks(
        monkeypatch,
        retrieved=[
            item("[#7] The deploy went out at 14:00.", kind="message", id="m7", seq=7, score=0.9),
            item("Alice prefers blue-green deploys.", kind="archival", id="a1", score=0.2),
            item("[#3] We froze the release branch.", kind="message", id="m3", seq=3, score=0.5),
            item("Release owner: Alice.", kind="archival", id="a2", score=0.7),
        ],
    )
    body = context(owner, conversation, user_message="When did the release go out?")
    # Placed best first, then sorted for reading: the memories (best first, as placed), then the messages
    # by seq.
    assert [i["id"] for i in body["blocks"]["B5"]["items"]] == ["a2", "a1", "m3", "m7"]
    assert body["messages"][-1]["content"].startswith(
        section(
            "## Retrieved context",
            "Release owner: Alice.",
            "Alice prefers blue-green deploys.",
            "[#3] We froze the release branch.",
            "[#7] The deploy went out at 14:00.",
        )
    )


def test_history_starts_after_the_last_compaction_boundary(owner, conversation, profile):
    append(
        conversation,
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer"},
        {"role": "system", "kind": Message.Kind.COMPACT_BOUNDARY, "content": "boundary"},
        {"role": "user", "kind": Message.Kind.COMPACT_SUMMARY, "content": "summary of the old exchange"},
        {"role": "user", "content": "new question"},
        {"role": "assistant", "content": "new answer"},
    )
    body = context(owner, conversation, user_message="next")
    assert body["window"]["boundary_seq"] == 3
    assert body["messages"][1:] == [
        {"role": "user", "content": "new question"},
        {"role": "assistant", "content": "new answer"},
        {"role": "user", "content": "next"},
    ]
    assert (body["blocks"]["B6"]["from_seq"], body["blocks"]["B6"]["to_seq"]) == (5, 6)


# --- tool calls and results ------------------------------------------------------------------------------

TOOL_HISTORY = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": "Checking both.",
        "parts": [
            {"type": "text", "text": "Checking both."},
            {"type": "tool_call", "id": "call_p", "name": "get_weather", "arguments": {"city": "Paris"}},
            {"type": "tool_call", "id": "call_r", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        ],
    },
    {
        "role": "tool",
        "parts": [
            {"type": "tool_result", "tool_call_id": "call_p", "content": "18°C, cloudy"},
            {
                "type": "tool_result",
                "tool_call_id": "call_r",
                "content": "upstream timeout",
                "is_error": True,
            },
        ],
    },
    {"role": "assistant", "content": "Paris is 18°C; Rome timed out."},
]
QUESTION = "And tomorrow?"

EXPECTED_HISTORY = {
    "openai": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking both.",
            "tool_calls": [
                {
                    "id": "call_p",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "call_r",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_p", "content": "18°C, cloudy"},
        {"role": "tool", "tool_call_id": "call_r", "content": "upstream timeout"},
        {"role": "assistant", "content": "Paris is 18°C; Rome timed out."},
        {"role": "user", "content": QUESTION},
    ],
    "anthropic": [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking both."},
                {"type": "tool_use", "id": "call_p", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_r", "name": "get_weather", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_p", "content": "18°C, cloudy"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_r",
                    "content": "upstream timeout",
                    "is_error": True,
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "text",
                    "text": "Paris is 18°C; Rome timed out.",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
        {"role": "user", "content": [{"type": "text", "text": QUESTION}]},
    ],
    "gemini": [
        {"role": "user", "parts": [{"text": "Weather in Paris and Rome?"}]},
        {
            "role": "model",
            "parts": [
                {"text": "Checking both."},
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
                {"functionCall": {"name": "get_weather", "args": {"city": "Rome"}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "get_weather", "response": {"content": "18°C, cloudy"}}},
                {"functionResponse": {"name": "get_weather", "response": {"content": "upstream timeout"}}},
            ],
        },
        {"role": "model", "parts": [{"text": "Paris is 18°C; Rome timed out."}]},
        {"role": "user", "parts": [{"text": QUESTION}]},
    ],
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_tool_calls_and_results_render_in_the_providers_shape(owner, conversation, fmt):
    url = f"/api/v1/conversations/{conversation.id}/messages"
    response = owner.client.post(url, {"messages": TOOL_HISTORY}, format="json")
    assert response.status_code == 201, response.content
    body = context(owner, conversation, user_message=QUESTION, format=fmt)
    assert body["messages"] == EXPECTED_HISTORY[fmt]


def test_openai_tool_call_without_text_has_null_content_and_json_arguments(owner, conversation):
    append(
        conversation,
        {"role": "user", "content": "Look up order 7"},
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "c7", "name": "order", "arguments": {"id": 7, "full": True}}
            ],
        },
        {"role": "tool", "parts": [{"type": "tool_result", "tool_call_id": "c7", "content": "shipped"}]},
    )
    call, result = context(owner, conversation, user_message="ok")["messages"][1:3]
    assert call["content"] is None
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"id": 7, "full": True}
    assert result == {"role": "tool", "tool_call_id": "c7", "content": "shipped"}


def test_anthropic_cache_control_marks_the_system_block_and_the_last_history_block_only(
    owner, conversation, profile
):
    append(conversation, *TOOL_HISTORY[:3])  # history ends with a tool message of two result blocks
    body = context(owner, conversation, user_message=QUESTION, format="anthropic")
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    last_history = body["messages"][-2]
    assert [("cache_control" in block) for block in last_history["content"]] == [False, True]
    assert dumps(body["messages"]).count("cache_control") == 1
    assert "cache_control" not in dumps(body["messages"][-1])


def test_anthropic_without_history_marks_only_the_system_block(owner, conversation, profile):
    body = context(owner, conversation, user_message="hello", format="anthropic")
    assert dumps(body["system"]).count("cache_control") == 1
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]


def test_the_breakpoint_does_not_leak_into_the_hashed_history(owner, conversation, profile):
    append(conversation, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"})
    first = context(owner, conversation, user_message="c", format="anthropic")
    append(conversation, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"})
    second = context(owner, conversation, user_message="e", format="anthropic")
    # The marker moved to the new last message; the old one renders without it, exactly as stored.
    assert first["messages"][1]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert second["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": "b"}]}
    # B6 is hashed without the marker, so the hash names the history, not where the breakpoint sits.
    history = second["messages"][:-1]
    history[-1] = {**history[-1], "content": [{"type": "text", "text": "d"}]}
    assert second["blocks"]["B6"]["sha256"] == sha256(canonical_json(history))


def empty_text_blocks(messages):
    return [
        (index, block)
        for index, message in enumerate(messages)
        for block in message["content"]
        if block.get("type") == "text" and not block["text"]
    ]


def test_anthropic_prompts_carry_no_empty_text_blocks(owner, conversation):
    url = f"/api/v1/conversations/{conversation.id}/messages"
    for message in [
        {"role": "user", "content": "Start the build."},
        {"role": "assistant", "content": "", "completed": False},  # a streamed reply cut off at once
        {"role": "user", "content": "Retry please."},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "b1", "name": "build", "arguments": {}}]},
        {"role": "tool", "parts": [{"type": "tool_result", "tool_call_id": "b1", "content": "ok"}]},
    ]:
        assert owner.client.post(url, message, format="json").status_code == 201
    # The agent loop continues after the tool result: no new user text.
    body = context(owner, conversation, user_message="", format="anthropic")
    assert empty_text_blocks(body["messages"]) == []
