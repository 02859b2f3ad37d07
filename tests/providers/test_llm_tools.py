"""chat_tools() against the OpenAI-compatible test server, through the real openai package: the tools reach
the endpoint, tool calls come back unexecuted (broken arguments included, for the caller to report), a
reply can be echoed into the next round, and failures are classified and retried like chat()'s."""

import json

import pytest

from providers.llm import LLMBadResponse, LLMTimeout, LLMUnavailable, ToolCall, chat_tools
from tests.llm_server import client_config, tool_call, tool_reply

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "archival_memory_search",
            "description": "Search archival memory.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]
MESSAGES = [{"role": "system", "content": "Remember things."}, {"role": "user", "content": "#1 user: hi"}]


config = client_config


def test_tools_are_sent_and_tool_calls_come_back_unexecuted(llm_server):
    llm_server.script(
        tool_reply(
            tool_call("archival_memory_search", {"query": "editor"}, call_id="call_a"),
            tool_call("archival_memory_search", "{not json", call_id="call_b"),
        )
    )
    reply = chat_tools(config(llm_server), MESSAGES, tools=TOOLS, max_tokens=200)
    assert reply.tool_calls == (
        ToolCall(id="call_a", name="archival_memory_search", arguments='{"query": "editor"}'),
        ToolCall(id="call_b", name="archival_memory_search", arguments="{not json"),
    )
    assert reply.text == ""
    assert (reply.prompt_tokens, reply.completion_tokens, reply.model) == (120, 30, "test-model")
    (request,) = llm_server.requests
    body = request["body"]
    assert body["tools"] == TOOLS
    assert body["tool_choice"] == "auto"
    assert body["max_tokens"] == 200
    assert body["messages"] == MESSAGES


def test_a_reply_is_echoed_into_the_next_round_with_the_tool_result(llm_server):
    llm_server.script(tool_reply(tool_call("archival_memory_search", {"query": "x"}, call_id="call_1")))
    llm_server.script(tool_reply(text="Nothing to remember."))
    first = chat_tools(config(llm_server), MESSAGES, tools=TOOLS, max_tokens=50)
    follow_up = [
        *MESSAGES,
        first.assistant_message(),
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"results": []})},
    ]
    second = chat_tools(config(llm_server), follow_up, tools=TOOLS, max_tokens=50)
    assert (second.text, second.tool_calls) == ("Nothing to remember.", ())
    sent = llm_server.requests[1]["body"]["messages"]
    assert sent[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "archival_memory_search", "arguments": '{"query": "x"}'},
            }
        ],
    }
    assert sent[3] == {"role": "tool", "tool_call_id": "call_1", "content": '{"results": []}'}


def test_5xx_is_retried_and_a_dropped_connection_is_unavailable(llm_server):
    llm_server.script("500", tool_reply(tool_call("archival_memory_search", {"query": "x"})))
    reply = chat_tools(config(llm_server), MESSAGES, tools=TOOLS, max_tokens=50, sleep=lambda s: None)
    assert reply.attempts == 2 and len(reply.tool_calls) == 1

    llm_server.default = "close"
    with pytest.raises(LLMUnavailable) as caught:
        chat_tools(config(llm_server, retries=1), MESSAGES, tools=TOOLS, max_tokens=50, sleep=lambda s: None)
    assert caught.value.attempts == 2


def test_timeouts_and_malformed_replies_are_classified(llm_server):
    llm_server.slow_seconds = 1.0
    llm_server.script("slow")
    with pytest.raises(LLMTimeout):
        chat_tools(config(llm_server, timeout=0.2, retries=0), MESSAGES, tools=TOOLS, max_tokens=50)
    llm_server.script("empty")
    with pytest.raises(LLMBadResponse):
        chat_tools(config(llm_server), MESSAGES, tools=TOOLS, max_tokens=50)
