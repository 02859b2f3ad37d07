"""The proxy starts embedding the question before it appends it (context/proxy/services.py), with the text
the pipeline's load stage asks for, so that stage finds the vector under way instead of starting another."""

from context.proxy import services
from context.proxy.wire import openai_request
from retrieval.questions import focused


def _started(monkeypatch, messages: list[dict]) -> list[str]:
    started: list[str] = []
    monkeypatch.setattr(services, "embed_query_ahead", started.append)
    services._embed_question_ahead(
        openai_request({"model": "gpt-4o", "messages": messages}, header_user=None)
    )
    return started


def test_a_plain_user_question_is_embedded_ahead_as_the_pipeline_will_ask_for_it(monkeypatch):
    question = "Can you list the order in which I brought up the export job and the billing sync?"
    history = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."}]
    assert _started(monkeypatch, [*history, {"role": "user", "content": question}]) == [focused(question)]


def test_a_list_that_does_not_end_with_plain_user_text_starts_nothing(monkeypatch):
    after_tool = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
    ]
    assert _started(monkeypatch, after_tool) == []
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
    with_image = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    assert _started(monkeypatch, with_image) == []
