"""readable values. JSON indented, the inspector's prompt with its line breaks and images as
thumbnails, validation errors as sentences, one history for a memory block, "Compact now" says what
happened, the site is titled Mnemo and model names read right."""

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from conversations.models import Message
from conversations.services import message_append_batch
from memory.services import core_memory_write
from tests.cold_storage.helpers import frame, image_part
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser_client(client):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


def test_the_site_is_titled_mnemo_and_model_names_read_right(superuser_client):
    html = superuser_client.get(reverse("admin:index")).content.decode()
    assert "Mnemo administration" in html and "| Mnemo admin</title>" in html
    assert "Django administration" not in html
    assert "Archival memories" in html and "memorys" not in html


def test_json_fields_are_indented(superuser_client, conversation):
    conversation.metadata = {"ticket": "OPS-1", "labels": ["a", "b"]}
    conversation.save()
    url = reverse("admin:conversations_conversation_change", args=[conversation.pk])
    html = superuser_client.get(url).content.decode()
    assert "{\n  &quot;labels&quot;: [\n    &quot;a&quot;," in html
    assert 'class="mnemo-json"' in html


def test_a_refused_part_reads_as_a_sentence(superuser_client, conversation):
    [result] = message_append_batch(conversation=conversation, items=[{"role": "user", "content": "hi"}])
    url = reverse("admin:conversations_message_change", args=[result.message.pk])
    page = superuser_client.post(
        url, {"content": "hi", "parts": '[{"type": "bogus"}]', "completed": "on", "metadata": "{}"}
    )
    assert page.status_code == 200
    errors = page.context["adminform"].form.errors["parts"]
    assert errors[0].startswith("Part 1: Unknown part type 'bogus'"), errors
    assert "ErrorDetail" not in page.content.decode()


def test_a_memory_blocks_history_is_its_operation_log(superuser_client, conversation):
    end_user = conversation.end_user
    block, _ = core_memory_write(end_user=end_user, label="preferences", value="tea")
    core_memory_write(end_user=end_user, label="preferences", value="coffee", expected_version=1)
    core_memory_write(end_user=end_user, label="persona", value="other block")
    url = reverse("admin:memory_corememoryblock_history", args=[block.pk])
    page = superuser_client.get(url, follow=True)
    assert page.status_code == 200
    operations = list(page.context["cl"].result_list)
    assert len(operations) == 2
    assert {op.target for op in operations} == {"core:preferences"}


def _compact(client, conversation):
    url = reverse("admin:conversations_conversation_changelist")
    page = client.post(url, {"action": "compact_now", "_selected_action": [conversation.pk]}, follow=True)
    return [str(m) for m in get_messages(page.wsgi_request)] or [str(m) for m in page.context["messages"]]


def test_compact_now_says_compacted_or_not_needed(superuser_client, conversation):
    assert "not needed" in " ".join(_compact(superuser_client, conversation))
    items = [
        {"role": r, "content": f"Message {i} about build {4100 + i}."} for i in range(40) for r in ["user"]
    ]
    message_append_batch(conversation=conversation, items=items)
    [text] = _compact(superuser_client, conversation)
    assert ": compacted messages 1–" in text and "tokens" in text


def test_compact_now_says_when_it_failed(superuser_client, conversation, monkeypatch):
    def boom(**kwargs):
        raise RuntimeError("summariser unreachable")

    monkeypatch.setattr("summaries.admin.compaction_run", boom)
    [text] = _compact(superuser_client, conversation)
    assert "compaction failed: summariser unreachable" in text


def test_the_inspector_shows_line_breaks_and_images_not_escapes_and_base64(
    superuser_client, owner, conversation
):
    base = f"/api/v1/conversations/{conversation.id}/messages"
    owner.client.post(base, {"role": "assistant", "content": "line one\nline two"}, format="json")
    parts = [{"type": "text", "text": "see"}, image_part(frame(5))]
    owner.client.post(base, {"role": "user", "content": "", "parts": parts}, format="json")
    assert Message.objects.filter(conversation=conversation).count() == 2
    page = superuser_client.post(
        reverse("admin:context_inspector"),
        {"conversation": conversation.pk, "user_message": "What?", "format": "openai"},
    )
    html = page.content.decode()
    messages_html = html.split('id="inspector-messages"')[1]
    assert "line one\nline two" in messages_html
    assert "\\n" not in messages_html
    assert '<img class="mnemo-thumb" src="data:image/' in messages_html
    assert messages_html.count("base64,") == messages_html.count('src="data:image/')  # only inside <img>


def test_read_only_json_is_indented_too(client, superuser_client, support, conversation):
    """A view-only user's JSON fields, and JSON fields declared read-only, read like the editable ones (they
    were one long line)."""
    from summaries.models import SummarySegment

    conversation.metadata = {"ticket": "OPS-1", "labels": ["a", "b"]}
    conversation.save()
    client.force_login(support.user)  # support reads conversations and does not edit them
    html = client.get(reverse("admin:conversations_conversation_change", args=[conversation.pk])).content
    metadata = html.decode().split('class="form-row field-metadata')[1].split('<div class="form-row')[0]
    assert '<pre class="mnemo-json">{\n  &quot;labels&quot;: [\n    &quot;a&quot;,' in metadata
    assert "<textarea" not in metadata and "Metadata" in metadata

    segment = SummarySegment.objects.create(
        conversation=conversation, start_seq=1, end_seq=2, text="s", token_count=1, metadata={"k": [1]}
    )
    url = reverse("admin:summaries_summarysegment_change", args=[segment.pk])
    html = superuser_client.get(url).content.decode()
    assert '<pre class="mnemo-json">{\n  &quot;k&quot;: [\n    1\n  ]\n}</pre>' in html
