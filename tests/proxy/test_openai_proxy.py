"""POST /v1/chat/completions and GET /v1/models through the real `openai` client against a live server."""

import json
import logging

import httpx
import openai
import pytest

from conversations.models import Message
from conversations.services import message_append_batch
from prefix_cache.models import CacheUsage
from tests.llm_server import tool_call, tool_reply
from tests.proxy.conftest import UPSTREAM_KEY, assert_interrupted_by_client, assistant_reply, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def client(url: str, key: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, default_headers=headers or None)


def stored(conversation_id) -> list[tuple[str, str, bool]]:
    return [
        (m.role, m.content, m.completed)
        for m in Message.objects.filter(conversation_id=conversation_id).order_by("seq")
    ]


def ask(sdk: openai.OpenAI, messages: list, **options):
    raw = sdk.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages, **options)
    return raw.parse(), raw.headers["x-mnemo-conversation"]


def test_non_streaming_round_trip_records_usage_against_the_prediction(owner, mnemo_url, llm_server):
    llm_server.reply = "Paris is the capital."
    llm_server.cached_tokens = 64
    completion, conversation_id = ask(
        client(mnemo_url, owner.raw_key), [{"role": "user", "content": "Capital of France?"}]
    )
    assert completion.choices[0].message.content == "Paris is the capital."
    assert stored(conversation_id) == [
        ("user", "Capital of France?", True),
        ("assistant", "Paris is the capital.", True),
    ]
    sent = llm_server.requests[-1]
    assert sent["auth"] == f"Bearer {UPSTREAM_KEY}"
    assert sent["body"]["model"] == "gpt-4o"
    assert sent["body"]["messages"][-1] == {"role": "user", "content": "Capital of France?"}
    usage = CacheUsage.objects.get(conversation_id=conversation_id)
    assert usage.reported_at is not None  # the context call's own row: actual next to predicted
    assert (usage.prompt_tokens, usage.cached_tokens) == (120, 64)
    assert usage.prefix_hash  # it was opened by the context assembly, with its prediction


def test_streaming_relays_chunks_and_stores_the_reply(owner, mnemo_url, llm_server):
    llm_server.reply = "one two three four"
    sdk = client(mnemo_url, owner.raw_key)
    with sdk.chat.completions.with_streaming_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "count"}],
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        conversation_id = response.headers["x-mnemo-conversation"]
        chunks = list(response.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three four"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 120
    assert llm_server.requests[-1]["body"]["stream"] is True
    assert wait_for(lambda: ("assistant", "one two three four", True) in stored(conversation_id))


def test_usage_chunk_is_recorded_but_not_relayed_unless_asked(owner, mnemo_url, llm_server):
    llm_server.cached_tokens = 32
    with client(mnemo_url, owner.raw_key).chat.completions.with_streaming_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
    ) as response:
        conversation_id = response.headers["x-mnemo-conversation"]
        chunks = list(response.parse())
    assert all(c.usage is None for c in chunks)
    # Upstream was asked for usage all the same, and it was recorded.
    assert llm_server.requests[-1]["body"]["stream_options"] == {"include_usage": True}
    assert wait_for(
        lambda: CacheUsage.objects.filter(conversation_id=conversation_id, cached_tokens=32).exists()
    )


def test_a_stream_ends_before_its_usage_is_recorded(owner, mnemo_url, llm_server, monkeypatch):
    """The usage report is off the client's clock: the stream's last byte arrives while the report is still
    held up. The reply, which the client's next turn must find, is stored before the last event."""
    import threading
    import time

    from context.proxy import services

    release, returned = threading.Event(), threading.Event()
    report, append = services.cache_usage_report, services.message_append_batch
    replied = []

    def stored_slowly(**kwargs):
        time.sleep(0.2)
        append(**kwargs)
        replied.append(1)

    def held(**kwargs):
        release.wait(10)
        report(**kwargs)
        returned.set()

    monkeypatch.setattr(services, "cache_usage_report", held)
    monkeypatch.setattr(services, "message_append_batch", stored_slowly)
    llm_server.reply = "one two three four"
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "count"}], "stream": True}
    headers = {"Authorization": f"Bearer {owner.raw_key}"}
    try:
        with httpx.stream("POST", f"{mnemo_url}/v1/chat/completions", json=body, headers=headers) as response:
            conversation_id = response.headers["x-mnemo-conversation"]
            events = []
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    events.append(bool(replied))  # the reply was stored before [DONE] was sent
                elif line:
                    events.append(line)
        assert not returned.is_set()
        assert events[-1] is True
        assert ("assistant", "one two three four", True) in stored(conversation_id)
    finally:
        release.set()
    assert wait_for(lambda: CacheUsage.objects.filter(conversation_id=conversation_id).exists())


def test_chunks_reach_the_client_before_the_upstream_finishes(owner, mnemo_url, llm_server):
    """The upstream pauses after three events and waits; the client still gets them (no buffering)."""
    llm_server.reply = "aaaa bbbb cccc dddd"
    llm_server.script("pause")
    try:
        stream = client(mnemo_url, owner.raw_key, **{"X-Mnemo-Test": "1"}).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "go"}], stream=True, timeout=10
        )
        first = [next(stream) for _ in range(3)]  # role chunk and two pieces, sent before the pause
        assert "".join(c.choices[0].delta.content or "" for c in first) == "aaaa bbbb "
    finally:
        llm_server.release.set()
    rest = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in rest if c.choices) == "cccc dddd"


def test_disconnect_mid_stream_leaves_a_partial_message(owner, mnemo_url, llm_server):
    """The client reads three chunks and goes away while the upstream is still talking."""
    llm_server.reply = "aaaa bbbb cccc dddd"
    llm_server.script("pause")
    sdk = client(mnemo_url, owner.raw_key)
    try:
        stream = sdk.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "go"}], stream=True, timeout=10
        )
        conversation_id = stream.response.headers["x-mnemo-conversation"]
        assert [next(stream).choices[0].delta.content for _ in range(3)] == ["", "aaaa ", "bbbb "]
        sdk.close()  # the connection goes with the client
        partial = assistant_reply(conversation_id)
    finally:
        llm_server.release.set()
    assert_interrupted_by_client(partial, "aaaa bbbb ")


def test_upstream_failure_mid_stream_keeps_the_partial_text_and_tells_the_client(
    owner, mnemo_url, llm_server
):
    llm_server.reply = "aaaa bbbb cccc dddd"
    llm_server.script("cut")
    sdk = client(mnemo_url, owner.raw_key)
    with sdk.chat.completions.with_streaming_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "go"}], stream=True
    ) as response:
        conversation_id = response.headers["x-mnemo-conversation"]
        with pytest.raises(openai.APIError, match="upstream"):
            list(response.parse())
    partial = wait_for(
        lambda: Message.objects.filter(conversation_id=conversation_id, role="assistant").first()
    )
    assert (partial.content, partial.completed) == ("aaaa bbbb ", False)


def test_whole_list_each_turn_appends_only_what_is_new(owner, mnemo_url, llm_server):
    sdk = client(mnemo_url, owner.raw_key)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "first"}]
    llm_server.reply = "reply one"
    _, conversation_id = ask(sdk, history)
    sdk = client(mnemo_url, owner.raw_key, **{"X-Mnemo-Conversation": conversation_id})
    history += [{"role": "assistant", "content": "reply one"}, {"role": "user", "content": "second"}]
    llm_server.reply = "reply two"
    ask(sdk, history)
    history += [{"role": "assistant", "content": "reply two"}, {"role": "user", "content": "third"}]
    llm_server.reply = "reply three"
    ask(sdk, history)
    ask(sdk, history)  # the same request again (a retry): nothing new
    assert [c for _, c, _ in stored(conversation_id)] == [
        "first", "reply one", "second", "reply two", "third", "reply three",
    ]  # fmt: skip
    # The client's system text leads the system message upstream; it is not stored as a message.
    assert llm_server.requests[-1]["body"]["messages"][0] == {"role": "system", "content": "Be brief."}


def test_new_turn_only_each_time_appends_no_duplicates(owner, mnemo_url, llm_server):
    sdk = client(mnemo_url, owner.raw_key)
    llm_server.reply = "reply one"
    _, conversation_id = ask(sdk, [{"role": "user", "content": "first"}])
    sdk = client(mnemo_url, owner.raw_key, **{"X-Mnemo-Conversation": conversation_id})
    llm_server.reply = "reply two"
    ask(sdk, [{"role": "user", "content": "second"}])
    llm_server.reply = "reply three"
    ask(sdk, [{"role": "user", "content": "first"}])  # the same words as the first turn: a new message
    assert [c for _, c, _ in stored(conversation_id)] == [
        "first", "reply one", "second", "reply two", "first", "reply three",
    ]  # fmt: skip
    # Upstream got the whole conversation from Mnemo, not just the turn the client sent.
    assert [m["content"] for m in llm_server.requests[-1]["body"]["messages"]] == [
        "first", "reply one", "second", "reply two", "first",
    ]  # fmt: skip


def test_whole_list_after_messages_appended_through_the_api(owner, conversation, mnemo_url, llm_server):
    """A conversation begun through the REST API, continued with new turns through the proxy."""
    message_append_batch(
        conversation=conversation,
        items=[{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "noted"}],
    )
    sdk = client(mnemo_url, owner.raw_key, **{"X-Mnemo-Conversation": str(conversation.id)})
    ask(sdk, [{"role": "user", "content": "now"}])
    assert [c for _, c, _ in stored(conversation.id)][:3] == ["earlier", "noted", "now"]


def test_whole_list_on_a_conversation_begun_through_the_api(owner, conversation, mnemo_url, llm_server):
    message_append_batch(
        conversation=conversation,
        items=[{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "noted"}],
    )
    sdk = client(mnemo_url, owner.raw_key, **{"X-Mnemo-Conversation": str(conversation.id)})
    history = [
        {"role": "user", "content": "earlier"},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": "now"},
    ]
    llm_server.reply = "reply now"
    ask(sdk, history)
    history += [{"role": "assistant", "content": "reply now"}, {"role": "user", "content": "later"}]
    ask(sdk, history)
    assert [c for _, c, _ in stored(conversation.id)][:5] == ["earlier", "noted", "now", "reply now", "later"]


def test_upstream_body_is_the_assembled_context(owner, mnemo_url, llm_server):
    sdk = client(mnemo_url, owner.raw_key)
    _, conversation_id = ask(sdk, [{"role": "user", "content": "first question"}])
    sdk = client(mnemo_url, owner.raw_key, **{"X-Mnemo-Conversation": conversation_id})
    ask(sdk, [{"role": "user", "content": "second question"}])
    question = Message.objects.get(conversation_id=conversation_id, content="second question")
    context = owner.client.post(
        f"/api/v1/conversations/{conversation_id}/context",
        {"user_message_id": str(question.id), "model": "gpt-4o", "format": "openai"},
        format="json",
    ).json()
    assert llm_server.requests[-1]["body"]["messages"] == context["messages"]


def test_tool_call_round_trip_is_stored_as_parts(owner, mnemo_url, llm_server):
    call = tool_call("get_weather", {"city": "Oslo"}, call_id="call_w1")
    llm_server.script(tool_reply(call))
    sdk = client(mnemo_url, owner.raw_key)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    history = [{"role": "user", "content": "Weather in Oslo?"}]
    completion, conversation_id = ask(sdk, history, tools=tools)
    assert completion.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert llm_server.requests[-1]["body"]["tools"] == tools  # options pass through
    history += [
        completion.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": "call_w1", "content": "12 °C, rain"},
    ]
    llm_server.reply = "It is 12 °C and raining."
    ask(client(mnemo_url, owner.raw_key, **{"X-Mnemo-Conversation": conversation_id}), history, tools=tools)
    messages = list(Message.objects.filter(conversation_id=conversation_id).order_by("seq"))
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1].parts == [
        {"type": "tool_call", "id": "call_w1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    ]
    assert messages[2].parts == [{"type": "tool_result", "tool_call_id": "call_w1", "content": "12 °C, rain"}]
    sent = llm_server.requests[-1]["body"]["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_w1", "content": "12 °C, rain"}
    assert sent[-2]["tool_calls"][0]["id"] == "call_w1"


@pytest.mark.parametrize(
    ("behaviour", "error", "status"),
    [("429", openai.RateLimitError, 429), ("500", openai.InternalServerError, 500)],
)
def test_upstream_errors_map_to_the_sdk_errors(owner, mnemo_url, llm_server, behaviour, error, status):
    llm_server.script(behaviour)
    with pytest.raises(error) as raised:
        client(mnemo_url, owner.raw_key).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
    assert raised.value.status_code == status
    assert raised.value.body["code"] in ("upstream_rate_limited", "upstream_error")
    if status == 429:
        assert raised.value.response.headers["retry-after"] == "7"


def test_streaming_request_refused_upstream_is_an_error_status(owner, mnemo_url, llm_server):
    llm_server.script("429")
    with pytest.raises(openai.RateLimitError):
        client(mnemo_url, owner.raw_key).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
        )


def test_upstream_past_the_deadline_is_a_504(owner, mnemo_url, llm_server, proxy_settings):
    proxy_settings.MNEMO_PROXY_DEADLINE_SECONDS = 1
    llm_server.slow_seconds = 3
    llm_server.script("slow")
    with pytest.raises(openai.APIStatusError) as raised:
        client(mnemo_url, owner.raw_key).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], timeout=10
        )
    assert raised.value.status_code == 504
    assert raised.value.body["code"] == "upstream_timeout"


def test_upstream_refusing_the_platform_key_is_not_the_clients_401(owner, mnemo_url, llm_server):
    llm_server.script("401")
    with pytest.raises(openai.APIStatusError) as raised:
        client(mnemo_url, owner.raw_key).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
    assert raised.value.status_code == 502


def test_outsider_cannot_use_anothers_conversation(outsider, conversation, mnemo_url, llm_server):
    sdk = client(mnemo_url, outsider.raw_key, **{"X-Mnemo-Conversation": str(conversation.id)})
    with pytest.raises(openai.NotFoundError) as raised:
        sdk.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.body["code"] == "conversation_not_found"
    assert not Message.objects.filter(conversation=conversation).exists()
    assert llm_server.requests == []


def test_unknown_key_is_the_sdks_authentication_error(mnemo_url, llm_server, db):
    with pytest.raises(openai.AuthenticationError):
        client(mnemo_url, "mnemo_nope_" + "x" * 40).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
    assert llm_server.requests == []


def test_models_lists_what_the_tenant_may_use(owner, mnemo_url):
    owner.tenant.settings = {**(owner.tenant.settings or {}), "proxy_models": ["gpt-4o", "gpt-4o-mini"]}
    owner.tenant.save()
    names = [m.id for m in client(mnemo_url, owner.raw_key).models.list()]
    assert names == ["gpt-4o", "gpt-4o-mini"]
    with pytest.raises(openai.NotFoundError):
        client(mnemo_url, owner.raw_key).chat.completions.create(
            model="gpt-4-turbo", messages=[{"role": "user", "content": "hi"}]
        )


def test_the_upstream_key_never_reaches_a_response_or_the_log(owner, mnemo_url, llm_server, caplog):
    caplog.set_level(logging.DEBUG)
    seen = []
    with httpx.Client(base_url=mnemo_url, headers={"Authorization": f"Bearer {owner.raw_key}"}) as http:
        for behaviour, stream in [
            ("good", False),
            ("good", True),
            ("429", False),
            ("500", True),
            ("401", False),
        ]:
            llm_server.script(behaviour)
            response = http.post(
                "/v1/chat/completions",
                json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": stream},
            )
            seen.append(response.text + json.dumps(dict(response.headers)))
    assert any("upstream" in text for text in seen)  # the error answers were read
    assert all(UPSTREAM_KEY not in text for text in seen)
    assert UPSTREAM_KEY not in caplog.text
    assert llm_server.requests[0]["auth"] == f"Bearer {UPSTREAM_KEY}"  # it was sent, upstream only


def test_the_preparation_runs_in_the_foreground(owner, mnemo_url, llm_server, monkeypatch):
    """The client waits on it as on a context call: the process's other requests step aside meanwhile
    (providers.lanes)."""
    from context.proxy import views
    from providers import lanes

    seen = []
    prepare = views.proxy_prepare

    def recording(**kwargs):
        seen.append(lanes.foreground_calls())
        return prepare(**kwargs)

    monkeypatch.setattr(views, "proxy_prepare", recording)
    ask(client(mnemo_url, owner.raw_key), [{"role": "user", "content": "Anyone there?"}])

    assert seen == [1]
    assert lanes.foreground_calls() == 0
