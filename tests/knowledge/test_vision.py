"""Image descriptions: with a vision-capable model each stored image is described once per tenant and
sha256, in the background, through the real `openai` client against a small OpenAI-compatible server on
127.0.0.1; the decay stage shows the description. Without one, the description is the image's id, format,
size and role, and the context response says so."""

import base64

import pytest
from django.core.cache import cache
from django.test import TestCase

from conversations.services import conversation_create, conversation_delete
from knowledge.models import ImageDescription
from knowledge.vision import model_reads_images
from tenants.models import LlmUsage
from tests.cold_storage.helpers import frame, image_part
from tests.context.helpers import context

pytestmark = pytest.mark.django_db

DESCRIPTION = "A sign-in dialog titled 'Sign in' showing the error 'Password expired' in red."


@pytest.fixture(autouse=True)
def _no_remembered_failures():
    cache.clear()  # failed calls are remembered in the cache for a while (RETRY_AFTER_SECONDS)
    yield
    cache.clear()


def tenant_settings(actor, **values):
    actor.tenant.settings = {**actor.tenant.settings, **values}
    actor.tenant.save(update_fields=["settings"])


def send_image(actor, conversation, data, *, content="what is this?"):
    """POST a user message with the image; what it queued on commit runs before this returns."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = actor.client.post(
            f"/api/v1/conversations/{conversation.id}/messages",
            {"role": "user", "content": content, "parts": [image_part(data)]},
            format="json",
        )
    assert response.status_code == 201, response.json()
    return response.json()


def image_requests(server) -> list[dict]:
    """The requests that carried an image (the query rewrite and others may call the same endpoint)."""
    found = []
    for request in server.requests:
        for message in request["body"].get("messages", []):
            content = message.get("content")
            if isinstance(content, list) and any(p.get("type") == "image_url" for p in content):
                found.append(request)
    return found


def image_item(body, image_id) -> dict:
    [item] = [i for i in body["blocks"]["attachments"]["items"] if i.get("id") == image_id]
    return item


def test_a_vision_model_describes_each_image_once_and_the_prompt_shows_it(
    owner, conversation, llm_settings, llm_server
):
    tenant_settings(owner, image_descriptions="on")
    llm_server.reply = DESCRIPTION
    data = frame(1)
    sent = send_image(owner, conversation, data)
    [request] = image_requests(llm_server)
    assert request["auth"] == "Bearer test-key" and request["body"]["model"] == "test-model"
    [part] = [p for p in request["body"]["messages"][0]["content"] if p["type"] == "image_url"]
    assert part["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(data).decode()
    row = ImageDescription.objects.get(tenant=owner.tenant)
    assert (row.text, row.model, row.sha256) == (DESCRIPTION, "test-model", sent_sha(sent))
    usage = LlmUsage.objects.get(tenant=owner.tenant, purpose="image_description")
    assert (usage.calls, usage.prompt_tokens) == (1, llm_server.prompt_tokens)

    # The same bytes again, in another conversation of the tenant: described already.
    other = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Other")
    send_image(owner, other, data)
    assert len(image_requests(llm_server)) == 1

    image_id = sent["parts"][0]["image_id"]
    body = context(owner, conversation, user_message_id=sent["id"])
    assert image_item(body, image_id)["described"] == "llm"
    assert DESCRIPTION in body["messages"][-1]["content"]
    assert not [d for d in body["degradations"] if d["stage"] == "decay"]


def sent_sha(sent) -> str:
    from cold_storage.models import ArchivedImage

    return ArchivedImage.objects.get(pk=sent["parts"][0]["image_id"]).sha256


def test_in_auto_mode_only_a_model_known_to_read_images_is_asked(
    owner, conversation, llm_settings, llm_server
):
    sent = send_image(owner, conversation, frame(2))
    assert image_requests(llm_server) == []
    body = context(owner, conversation, user_message_id=sent["id"])
    assert image_item(body, sent["parts"][0]["image_id"])["described"] == "offline"
    [degradation] = [d for d in body["degradations"] if d["stage"] == "decay"]
    assert degradation["code"] == "image_description_offline"
    assert "test-model is not known to read images" in degradation["message"]

    tenant_settings(owner, vision_model="gpt-4o-mini")
    send_image(owner, conversation, frame(3))
    [request] = image_requests(llm_server)
    assert request["body"]["model"] == "gpt-4o-mini"


def test_a_failed_call_is_not_repeated_at_once_and_the_response_says_pending(
    owner, conversation, llm_settings, llm_server
):
    tenant_settings(owner, image_descriptions="on")
    llm_server.script("401")  # refused: not retried
    sent = send_image(owner, conversation, frame(4))
    assert len(image_requests(llm_server)) == 1
    assert not ImageDescription.objects.exists()
    with TestCase.captureOnCommitCallbacks(execute=True):
        body = context(owner, conversation, user_message_id=sent["id"])
    [degradation] = [d for d in body["degradations"] if d["stage"] == "decay"]
    assert degradation["code"] == "image_description_pending"
    assert len(image_requests(llm_server)) == 1  # the failure is remembered for RETRY_AFTER_SECONDS

    cache.clear()  # later: the next context call queues it again, and this time it works
    llm_server.reply = DESCRIPTION
    with TestCase.captureOnCommitCallbacks(execute=True):
        context(owner, conversation, user_message_id=sent["id"])
    assert len(image_requests(llm_server)) == 2
    body = context(owner, conversation, user_message_id=sent["id"])
    assert image_item(body, sent["parts"][0]["image_id"])["described"] == "llm"


def test_a_spent_monthly_budget_describes_offline(owner, conversation, llm_settings, llm_server):
    tenant_settings(owner, image_descriptions="on", llm_monthly_token_budget=0)
    send_image(owner, conversation, frame(5))
    assert image_requests(llm_server) == []
    assert LlmUsage.objects.get(tenant=owner.tenant, purpose="image_description").budget_fallbacks == 1


def test_descriptions_are_per_tenant_and_go_with_the_last_image(
    owner, outsider, conversation, llm_settings, llm_server
):
    tenant_settings(owner, image_descriptions="on")
    tenant_settings(outsider, image_descriptions="on")
    llm_server.reply = DESCRIPTION
    data = frame(6)
    send_image(owner, conversation, data)
    theirs = conversation_create(tenant=outsider.tenant, end_user_external_id="mallory")
    send_image(outsider, theirs, data)
    # The same bytes in another tenant are described for that tenant: nothing is shared across tenants.
    assert len(image_requests(llm_server)) == 2
    assert ImageDescription.objects.filter(tenant=outsider.tenant).count() == 1
    with TestCase.captureOnCommitCallbacks(execute=True):
        conversation_delete(conversation=conversation)
    assert not ImageDescription.objects.filter(tenant=owner.tenant).exists()
    assert ImageDescription.objects.filter(tenant=outsider.tenant).exists()


@pytest.mark.parametrize(
    ("model", "reads"),
    [
        ("gpt-4o-mini", True),
        ("openai/gpt-4.1", True),
        ("claude-3-5-sonnet-20241022", True),
        ("Qwen/Qwen2.5-VL-7B-Instruct", True),
        ("llama3.2-vision", True),
        ("gpt-3.5-turbo", False),
        ("llama3.1", False),
        ("test-model", False),
    ],
)
def test_models_known_to_read_images(model, reads):
    assert model_reads_images(model) is reads


def test_a_described_image_is_found_by_what_it_showed(owner, conversation, llm_settings, llm_server):
    from tests.context.helpers import append, exchanges

    tenant_settings(owner, image_descriptions="on")
    shown = {}
    for seed, description in (
        (7, "A terminal window: the backup job failed with 'disk quota exceeded' on /var/backups."),
        (8, "A bar chart of monthly revenue for 2025, highest in November."),
    ):
        llm_server.reply = description
        shown[seed] = send_image(owner, conversation, frame(seed), content="look")["parts"][0]["image_id"]
        append(conversation, {"role": "assistant", "content": "Seen."})
    exchanges(conversation, 40, tokens=60)  # the two images fall out of the window at a small budget
    question = "Which backup job error about the disk quota came up?"
    # With the whole history in view the pixels are there: neither an attachment nor a retrieved image.
    body = context(owner, conversation, user_message=question, token_budget=100_000)
    assert not [i for i in body["blocks"].get("B5", {}).get("items", []) if i.get("image")]
    assert "attachments" not in body["blocks"]
    # At a small budget the window moves past them: the matching one is retrieved by its description.
    body = context(owner, conversation, user_message=question, token_budget=1500)
    found = [i for i in body["blocks"]["B5"]["items"] if i.get("image")]
    assert [i["image"] for i in found] == [shown[7]]
    assert found[0]["citation"].startswith(f"image {shown[7]}, message #")
    assert "'disk quota exceeded' on /var/backups" in body["messages"][-1]["content"]
    # Out of the window, both are earlier attachments of this conversation: summarised (P2).
    levels = {i["id"]: (i["priority"], i["level"]) for i in body["blocks"]["attachments"]["items"]}
    assert levels == {shown[7]: ("P2", "summary"), shown[8]: ("P2", "summary")}


def test_an_image_whose_bytes_retention_deleted_is_not_queued_again(
    owner, conversation, llm_settings, llm_server
):
    from django.utils import timezone

    from cold_storage.models import ArchivedImage

    tenant_settings(owner, image_descriptions="on")
    llm_server.script("401")
    sent = send_image(owner, conversation, frame(12))
    cache.clear()  # the failure is forgotten: only the missing bytes keep it from being queued
    ArchivedImage.objects.filter(pk=sent["parts"][0]["image_id"]).update(
        purged_at=timezone.now(), storage_key=""
    )
    with TestCase.captureOnCommitCallbacks(execute=True):
        body = context(owner, conversation, user_message_id=sent["id"])
    [degradation] = [d for d in body["degradations"] if d["stage"] == "decay"]
    assert degradation["code"] == "image_description_offline"
    assert "deleted by retention" in degradation["message"]
    assert len(image_requests(llm_server)) == 1


def test_the_settings_are_part_of_the_tenant_schema():
    from tenants.settings_schema import SettingsInvalid, settings_validate

    assert settings_validate({"image_descriptions": "on", "vision_model": "llava"}) == {
        "image_descriptions": "on",
        "vision_model": "llava",
    }
    with pytest.raises(SettingsInvalid):
        settings_validate({"image_descriptions": "sometimes"})


def test_a_bad_stored_mode_falls_back_to_auto(owner, llm_settings):
    from knowledge.vision import vision_status

    tenant_settings(owner, image_descriptions="sometimes")
    assert "test-model is not known to read images" in vision_status(owner.tenant).reason
    tenant_settings(owner, image_descriptions="on")
    assert vision_status(owner.tenant).config.model == "test-model"
