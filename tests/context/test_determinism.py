"""The same state renders the same bytes; unrelated writes change nothing; B6 grows as a byte prefix;
history is rendered from stored content only."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from context.models import ConversationContext
from context.services import agent_profile_create
from conversations.services import conversation_create
from prefix_cache.models import PrefixHint
from prefix_cache.rendering import FORMATS
from tests.context.helpers import append, context, dumps

pytestmark = pytest.mark.django_db

ATTACHMENT = {"name": "report.csv", "description": "Quarterly revenue", "content": "q1,q2\n100,120"}


@pytest.fixture
def profile(owner):
    return agent_profile_create(
        tenant=owner.tenant,
        name="Billing assistant",
        scope="invoices and refunds",
        policy="Answer in two sentences.\nNever promise a refund.",
        is_default=True,
    )


@pytest.fixture
def history(conversation):
    return append(
        conversation,
        {"role": "user", "content": "Invoice INV-2041 looks wrong."},
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "call_1",
                    "name": "lookup_invoice",
                    "arguments": {"id": "INV-2041"},
                }
            ],
        },
        {
            "role": "tool",
            "parts": [{"type": "tool_result", "tool_call_id": "call_1", "content": "120.00 EUR"}],
        },
        {"role": "assistant", "content": "It says 120.00 EUR; your contract says 100.00 EUR."},
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_same_state_renders_byte_identical_prompts(owner, conversation, profile, history, fmt):
    body = {"user_message": "Can you correct it?", "format": fmt, "attachments": [ATTACHMENT]}
    first = context(owner, conversation, **body)
    second = context(owner, conversation, **body)

    assert first["format"] == fmt
    assert dumps(second["messages"]) == dumps(first["messages"])
    assert dumps(second["system"]) == dumps(first["system"])
    assert second["prefix"]["hashes"] == first["prefix"]["hashes"]
    assert second["blocks"] == first["blocks"]
    # Each call is recorded on its own (a PrefixHint hit, a new CacheUsage row), yet the prompt is the same.
    assert second["context_id"] != first["context_id"]
    assert second["prefix"]["hint_level"] == "B1+B2a+B4+B6"


def test_the_system_text_is_the_same_in_every_format(owner, conversation, profile, history):
    rendered = {fmt: context(owner, conversation, user_message="Hi", format=fmt) for fmt in FORMATS}
    expected = profile.render()
    assert rendered["openai"]["system"] == expected
    assert rendered["openai"]["messages"][0] == {"role": "system", "content": expected}
    assert rendered["anthropic"]["system"][0]["text"] == expected
    assert rendered["gemini"]["system"] == {"parts": [{"text": expected}]}


def test_unrelated_writes_leave_the_prompt_and_its_hashes_unchanged(
    owner, outsider, conversation, outsider_conversation, profile, history
):
    body = {"user_message": "Can you correct it?"}
    before = context(owner, conversation, **body)

    # Another conversation of the same tenant gets messages, and so does the outsider's.
    other = conversation_create(tenant=owner.tenant, end_user_external_id="bob", title="Other")
    append(
        other, {"role": "user", "content": "Unrelated question"}, {"role": "assistant", "content": "Reply"}
    )
    append(outsider_conversation, {"role": "user", "content": "Outsider talk"})
    # Another tenant's default profile with the very same name, and a non-default profile in this tenant.
    agent_profile_create(
        tenant=outsider.tenant, name="Billing assistant", policy="Other rules.", is_default=True
    )
    agent_profile_create(tenant=owner.tenant, name="Archived assistant", policy="Unused.")
    # A hint nobody sent, at the B1 level.
    PrefixHint.objects.create(tenant=owner.tenant, level="B1", hash="0" * 64, token_count=12)
    # A context call in another conversation (its own hints and usage rows).
    context(owner, other, user_message="Anything new?")

    after = context(owner, conversation, **body)
    assert after["system"] == before["system"]
    assert after["blocks"]["B1"] == before["blocks"]["B1"]
    assert after["prefix"]["hashes"] == before["prefix"]["hashes"]
    assert dumps(after["messages"]) == dumps(before["messages"])
    assert after["prefix"]["hint_level"] == "B1+B2a+B4+B6"


@pytest.mark.parametrize("fmt", ["openai", "gemini"])
def test_history_grows_and_each_prompt_is_a_byte_prefix_of_the_next(owner, conversation, profile, fmt):
    append(
        conversation,
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi, how can I help?"},
    )
    url = f"/api/v1/conversations/{conversation.id}/messages"
    previous = None
    for turn in range(1, 5):
        question = f"Question number {turn}: what about invoice {1000 + turn}?"
        current = context(owner, conversation, user_message=question, format=fmt)
        messages = current["messages"]
        if previous is not None:
            kept = previous["messages"][:-1]  # the previous prompt minus its current user message
            assert messages[: len(kept)] == kept
            assert dumps(messages).startswith(dumps(kept)[:-1])
            # The previous question now comes from the transcript, rendered exactly as it was sent.
            assert messages[len(kept)] == previous["messages"][-1]
            assert len(messages) == len(previous["messages"]) + 2
            assert current["system"] == previous["system"]
            assert current["prefix"]["hint_level"] == "B1+B2a+B4"
            assert current["dropped"] == []
        assert current["window"]["window_start_seq"] == 0
        # The client stores the question and the model's answer, as a chat app does.
        assert owner.client.post(url, {"role": "user", "content": question}, format="json").status_code == 201
        reply = {"role": "assistant", "content": f"Answer {turn}."}
        assert owner.client.post(url, reply, format="json").status_code == 201
        previous = current
    assert ConversationContext.objects.get(conversation=conversation).window_start_seq == 0


def test_the_system_message_carries_nothing_per_request(owner, conversation, profile, monkeypatch):
    first = context(owner, conversation, user_message="What is due this month?")
    later = timezone.now() + timedelta(days=400, hours=7, minutes=13)
    monkeypatch.setattr(timezone, "now", lambda: later)
    second = context(owner, conversation, user_message="What is due this month?")

    assert first["system"] == second["system"] == profile.render()
    assert first["prefix"]["hashes"] == second["prefix"]["hashes"]
    for per_request in (first["context_id"], second["context_id"], str(conversation.id), str(later.year)):
        assert per_request not in first["system"]
    assert not re.search(r"\d{4}-\d{2}-\d{2}|\d{1,2}:\d{2}", first["system"])


def test_history_is_rendered_from_stored_content_not_from_the_blocks_it_carried(owner, conversation, profile):
    question = "Summarise the attached file."
    first = context(owner, conversation, user_message=question, attachments=[ATTACHMENT])
    carried = first["messages"][-1]["content"]
    assert "## Attachments and tool output\n- report.csv" in carried
    assert carried.endswith("## User question\n" + question)

    # The client stores the question as the user wrote it, then the reply.
    append(
        conversation, {"role": "user", "content": question}, {"role": "assistant", "content": "Q2 grew 20%."}
    )
    second = context(owner, conversation, user_message="Thanks!")
    assert second["messages"][1:] == [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "Q2 grew 20%."},
        {"role": "user", "content": "Thanks!"},
    ]
    assert "report.csv" not in dumps(second["messages"])


def test_a_stored_question_sent_by_id_carries_its_blocks_only_while_current(owner, conversation, profile):
    [stored] = append(conversation, {"role": "user", "content": "What does the log say?"})
    log = {"name": "build.log", "content": "error: missing semicolon at main.c:12"}
    current = context(owner, conversation, user_message_id=str(stored.id), attachments=[log])
    assert current["messages"][-1]["content"] == (
        "## Attachments and tool output\n- build.log\nerror: missing semicolon at main.c:12"
        "\n\n## User question\nWhat does the log say?"
    )

    append(conversation, {"role": "assistant", "content": "A semicolon is missing on line 12."})
    later = context(owner, conversation, user_message="Fixed, thanks.")
    assert later["messages"][1] == {"role": "user", "content": "What does the log say?"}
    assert "build.log" not in dumps(later["messages"])
