"""POST /v1/messages through the real `anthropic` client against a live server; the upstream speaks the
Anthropic wire format (tests/llm_server.py)."""

import anthropic
import pytest

from conversations.models import Message
from prefix_cache.models import CacheUsage
from tests.llm_server import tool_call, tool_reply
from tests.proxy.conftest import UPSTREAM_KEY, assert_interrupted_by_client, assistant_reply, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def client(url: str, key: str, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, default_headers=headers or None)


def ask(sdk: anthropic.Anthropic, messages: list, **options):
    raw = sdk.messages.with_raw_response.create(
        model="claude-3-5-sonnet", max_tokens=256, messages=messages, **options
    )
    return raw.parse(), raw.headers["x-mnemo-conversation"]


def test_non_streaming_round_trip_with_cache_breakpoints(owner, mnemo_url, llm_server):
    llm_server.reply = "Hello back."
    llm_server.cached_tokens = 100
    sdk = client(mnemo_url, owner.raw_key)
    message, conversation_id = ask(sdk, [{"role": "user", "content": "hello"}], system="Be brief.")
    assert message.content[0].text == "Hello back."
    sent = llm_server.requests[-1]
    assert sent["path"] == "/v1/messages"
    assert sent["x_api_key"] == UPSTREAM_KEY
    assert sent["body"]["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    ]
    assert sent["body"]["max_tokens"] == 256
    usage = CacheUsage.objects.get(conversation_id=conversation_id)
    assert (usage.provider, usage.cached_tokens, usage.prompt_tokens) == ("anthropic", 100, 120)

    sdk = client(mnemo_url, owner.raw_key, **{"X-Mnemo-Conversation": conversation_id})
    history = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello back."}]},
        {"role": "user", "content": "and again"},
    ]
    ask(sdk, history, system="Be brief.")
    sent = llm_server.requests[-1]["body"]["messages"]
    # The breakpoint after the last history message; the question after it.
    assert sent[-2]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert sent[-1] == {"role": "user", "content": [{"type": "text", "text": "and again"}]}
    stored = [(m.role, m.content) for m in Message.objects.filter(conversation_id=conversation_id)]
    assert stored == [
        ("user", "hello"), ("assistant", "Hello back."), ("user", "and again"), ("assistant", "Hello back."),
    ]  # fmt: skip


def test_streaming_round_trip(owner, mnemo_url, llm_server):
    llm_server.reply = "streamed words here"
    sdk = client(mnemo_url, owner.raw_key)
    with sdk.messages.stream(
        model="claude-3-5-sonnet", max_tokens=256, messages=[{"role": "user", "content": "go"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
        conversation_id = stream.response.headers["x-mnemo-conversation"]
    assert text == "streamed words here"
    assert final.usage.output_tokens == llm_server.completion_tokens
    assert llm_server.requests[-1]["body"]["stream"] is True
    assert wait_for(
        lambda: Message.objects.filter(
            conversation_id=conversation_id, role="assistant", content="streamed words here", completed=True
        ).exists()
    )


def test_tool_use_round_trip(owner, mnemo_url, llm_server):
    llm_server.reply = ""
    llm_server.script(tool_reply(tool_call("lookup", {"q": "mnemo"}, call_id="toolu_1")))
    sdk = client(mnemo_url, owner.raw_key)
    tools = [{"name": "lookup", "description": "search", "input_schema": {"type": "object"}}]
    history = [{"role": "user", "content": "find mnemo"}]
    with sdk.messages.stream(model="claude-3-5-sonnet", max_tokens=256, messages=history, tools=tools) as s:
        reply = s.get_final_message()
        conversation_id = s.response.headers["x-mnemo-conversation"]
    assert reply.content[0].type == "tool_use" and reply.content[0].input == {"q": "mnemo"}
    history += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in reply.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "found"}]},
    ]
    llm_server.reply = "Found it."
    ask(client(mnemo_url, owner.raw_key, **{"X-Mnemo-Conversation": conversation_id}), history, tools=tools)
    messages = list(Message.objects.filter(conversation_id=conversation_id).order_by("seq"))
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1].parts == [
        {"type": "tool_call", "id": "toolu_1", "name": "lookup", "arguments": {"q": "mnemo"}}
    ]
    assert messages[2].parts == [{"type": "tool_result", "tool_call_id": "toolu_1", "content": "found"}]
    sent = llm_server.requests[-1]["body"]["messages"]
    # After a tool result the agent loop goes on: it is the last history message and carries the breakpoint.
    assert sent[-1]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": "found",
        "cache_control": {"type": "ephemeral"},
    }


@pytest.mark.parametrize(
    ("behaviour", "error"),
    [("429", anthropic.RateLimitError), ("500", anthropic.InternalServerError)],
)
def test_upstream_errors_map_to_the_sdk_errors(owner, mnemo_url, llm_server, behaviour, error):
    llm_server.script(behaviour)
    with pytest.raises(error) as raised:
        ask(client(mnemo_url, owner.raw_key), [{"role": "user", "content": "hi"}])
    assert raised.value.status_code == int(behaviour)
    assert raised.value.body["type"] == "error"
    if behaviour == "429":
        assert raised.value.response.headers["retry-after"] == "7"


def test_outsider_cannot_use_anothers_conversation(outsider, conversation, mnemo_url, llm_server):
    sdk = client(mnemo_url, outsider.raw_key, **{"X-Mnemo-Conversation": str(conversation.id)})
    with pytest.raises(anthropic.NotFoundError) as raised:
        ask(sdk, [{"role": "user", "content": "hi"}])
    assert raised.value.body["error"]["type"] == "not_found_error"
    assert llm_server.requests == []


def test_models_through_the_anthropic_client(owner, mnemo_url):
    names = [m.id for m in client(mnemo_url, owner.raw_key).models.list()]
    assert "claude-3-5-sonnet" in names or any(n.startswith("claude") for n in names)


def test_disconnect_mid_stream_leaves_a_partial_message(owner, mnemo_url, llm_server):
    """The client reads three text chunks and goes away while the upstream is still talking."""
    llm_server.reply = "aaaa bbbb cccc dddd"
    llm_server.pause_after = 6  # message_start, ping, content_block_start and three text deltas
    llm_server.script("pause")
    sdk = client(mnemo_url, owner.raw_key)
    try:
        stream = sdk.messages.create(
            model="claude-3-5-sonnet",
            max_tokens=256,
            messages=[{"role": "user", "content": "go"}],
            stream=True,
            timeout=10,
        )
        conversation_id = stream.response.headers["x-mnemo-conversation"]
        texts = []
        for event in stream:
            if event.type == "content_block_delta":
                texts.append(event.delta.text)
            if len(texts) == 3:
                break
        assert texts == ["aaaa ", "bbbb ", "cccc "]
        sdk.close()  # the connection goes with the client
        partial = assistant_reply(conversation_id)
    finally:
        llm_server.release.set()
    assert_interrupted_by_client(partial, "aaaa bbbb cccc ")


def test_upstream_past_the_deadline_is_the_sdks_timeout_error(owner, mnemo_url, llm_server, proxy_settings):
    proxy_settings.MNEMO_PROXY_DEADLINE_SECONDS = 1
    llm_server.slow_seconds = 3
    llm_server.script("slow", "slow")
    for stream in (False, True):
        with pytest.raises(anthropic.InternalServerError) as raised:
            ask(
                client(mnemo_url, owner.raw_key),
                [{"role": "user", "content": "hi"}],
                stream=stream,
                timeout=10,
            )
        assert raised.value.status_code == 504
        assert raised.value.body["error"]["type"] == "timeout_error"
        assert raised.value.body["error"]["code"] == "upstream_timeout"


def test_a_stream_that_hangs_past_the_deadline_ends_with_an_error_event(
    owner, mnemo_url, llm_server, proxy_settings
):
    """The upstream sends two text chunks, then nothing: the deadline ends the stream, the SDK raises the
    error event, and the partial text is stored."""
    proxy_settings.MNEMO_PROXY_DEADLINE_SECONDS = 1
    llm_server.reply = "aaaa bbbb cccc dddd"
    llm_server.pause_after = 5
    llm_server.script("pause")
    sdk = client(mnemo_url, owner.raw_key)
    texts = []
    try:
        with sdk.messages.stream(
            model="claude-3-5-sonnet",
            max_tokens=256,
            messages=[{"role": "user", "content": "go"}],
            timeout=10,
        ) as stream:
            conversation_id = stream.response.headers["x-mnemo-conversation"]
            with pytest.raises(anthropic.APIStatusError) as raised:
                texts.extend(stream.text_stream)
    finally:
        llm_server.release.set()
    assert texts == ["aaaa ", "bbbb "]
    assert raised.value.body["error"]["type"] == "timeout_error"
    partial = wait_for(
        lambda: Message.objects.filter(conversation_id=conversation_id, role="assistant").first()
    )
    assert (partial.content, partial.completed) == ("aaaa bbbb ", False)
    assert partial.metadata["interrupted"] == "timeout"
