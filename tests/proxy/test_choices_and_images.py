"""What the proxy does with OpenAI's `n` and with images: one choice per turn (n > 1 is refused before
anything is stored or sent), images inline as base64 (stored as the conversation's images and shown
upstream), image URLs refused with a 400 that says what to send instead, never fetched."""

import anthropic
import openai
import pytest

from cold_storage.models import ArchivedImage
from conversations.models import Conversation, Message
from tests.cold_storage.helpers import b64, frame

pytestmark = pytest.mark.django_db(transaction=True)

PNG = frame(7)
REMOTE = "https://images.example.com/cat.png"


def openai_client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def anthropic_client(url: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)


def nothing_happened(owner, llm_server):
    assert not Conversation.objects.filter(tenant=owner.tenant).exists()
    assert not Message.objects.exists()
    assert llm_server.requests == []


@pytest.mark.parametrize("stream", [False, True])
def test_more_than_one_choice_is_refused_before_anything_happens(owner, mnemo_url, llm_server, stream):
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client(mnemo_url, owner.raw_key).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], n=3, stream=stream
        )
    error = raised.value.body
    assert (error["code"], error["param"]) == ("unsupported", "n")
    assert "one reply per turn" in error["message"]
    nothing_happened(owner, llm_server)


def test_a_malformed_n_is_an_invalid_request(owner, mnemo_url, llm_server):
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client(mnemo_url, owner.raw_key).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], n=0
        )
    assert (raised.value.body["code"], raised.value.body["param"]) == ("invalid_request", "n")
    nothing_happened(owner, llm_server)


def test_one_choice_asked_for_explicitly_goes_through(owner, mnemo_url, llm_server):
    llm_server.reply = "Only one."
    raw = openai_client(mnemo_url, owner.raw_key).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], n=1
    )
    assert raw.parse().choices[0].message.content == "Only one."
    assert llm_server.requests[-1]["body"]["n"] == 1
    conversation_id = raw.headers["x-mnemo-conversation"]
    assert Message.objects.filter(conversation_id=conversation_id, content="Only one.").exists()


def test_an_inline_image_is_stored_and_shown_upstream_openai(owner, mnemo_url, llm_server):
    content = [
        {"type": "text", "text": "What is on this screen?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}", "detail": "low"}},
    ]
    raw = openai_client(mnemo_url, owner.raw_key).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": content}]
    )
    conversation_id = raw.headers["x-mnemo-conversation"]
    question = Message.objects.get(conversation_id=conversation_id, role="user")
    assert question.content == "What is on this screen?"
    [part] = question.parts
    image = ArchivedImage.objects.get(pk=part["image_id"], tenant=owner.tenant)
    assert (image.size, image.format.upper()) == (len(PNG), "PNG")
    sent = [
        block
        for message in llm_server.requests[-1]["body"]["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "image_url"
    ]
    assert len(sent) == 1 and sent[0]["image_url"]["url"].startswith("data:image/png;base64,")


def test_an_inline_image_is_stored_and_shown_upstream_anthropic(owner, mnemo_url, llm_server):
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
        {"type": "text", "text": "What is on this screen?"},
    ]
    raw = anthropic_client(mnemo_url, owner.raw_key).messages.with_raw_response.create(
        model="claude-3-5-sonnet", max_tokens=64, messages=[{"role": "user", "content": content}]
    )
    conversation_id = raw.headers["x-mnemo-conversation"]
    [part] = Message.objects.get(conversation_id=conversation_id, role="user").parts
    assert ArchivedImage.objects.filter(pk=part["image_id"], tenant=owner.tenant, size=len(PNG)).exists()
    sent = [
        block
        for message in llm_server.requests[-1]["body"]["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "image"
    ]
    assert len(sent) == 1 and sent[0]["source"]["type"] == "base64"


@pytest.mark.parametrize("url", [REMOTE, "http://127.0.0.1:9/private.png"])
def test_an_image_url_is_refused_not_fetched_openai(owner, mnemo_url, llm_server, url):
    content = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}}]
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client(mnemo_url, owner.raw_key).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": content}]
        )
    error = raised.value.body
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "unsupported",
        "messages.0",
    )
    assert "not fetched" in error["message"] and "base64" in error["message"]
    nothing_happened(owner, llm_server)


def test_an_image_url_source_is_refused_not_fetched_anthropic(owner, mnemo_url, llm_server):
    content = [{"type": "image", "source": {"type": "url", "url": REMOTE}}, {"type": "text", "text": "look"}]
    with pytest.raises(anthropic.BadRequestError) as raised:
        anthropic_client(mnemo_url, owner.raw_key).messages.create(
            model="claude-3-5-sonnet", max_tokens=64, messages=[{"role": "user", "content": content}]
        )
    error = raised.value.body["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "unsupported")
    assert "not fetched" in error["message"]
    nothing_happened(owner, llm_server)


@pytest.mark.parametrize(
    "image_url", [{"url": "ftp://example.com/a.png"}, {"url": "data:image/png,rawbytes"}, "not-an-object"]
)
def test_a_malformed_image_is_an_invalid_request(owner, mnemo_url, llm_server, image_url):
    content = [{"type": "image_url", "image_url": image_url}]
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client(mnemo_url, owner.raw_key).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": content}]
        )
    assert raised.value.body["code"] == "invalid_request"
    nothing_happened(owner, llm_server)
