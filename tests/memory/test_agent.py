"""The memory agent: after a completed exchange, rules decide what to remember; every operation is logged
(actor agent) and readable at …/memory/operations; a run is idempotent by its cursor."""

import pytest

from memory.agent import memory_agent_run
from memory.models import ArchivalMemory, CoreMemoryBlock, MemoryAgentCursor
from tests.summaries.helpers import append, context

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("lexical_only")]


def test_rules_remember_names_preferences_decisions_and_facts(owner, conversation):
    append(
        conversation,
        {
            "role": "user",
            "content": "Call me Ali. I prefer answers in German. "
            "Remember that the VPN key rotates on Mondays.\n"
            "We decided to freeze deploys on Fridays. My favourite editor is Helix.",
        },
        {"role": "assistant", "content": "Noted."},
    )
    run = memory_agent_run(conversation=conversation)
    assert [op["rule"] for op in run.operations] == [
        "name",
        "preference",
        "preference",
        "remember",
        "decision",
        "fact",
    ]
    blocks = {b.label: b.value for b in CoreMemoryBlock.objects.all()}
    # A preference is kept verbatim with the #seq of its message (tests/memory/test_instructions.py).
    assert blocks == {"profile": "Name: Ali", "preferences": "#1 I prefer answers in German."}
    kinds = dict(ArchivalMemory.objects.values_list("content", "kind"))
    assert kinds == {
        "I prefer answers in German": "preference",
        "the VPN key rotates on Mondays": "fact",
        "We decided to freeze deploys on Fridays": "decision",
        "My favourite editor is Helix": "fact",
    }
    ops = owner.client.get("/api/v1/users/alice/memory/operations").json()["operations"]
    assert {o["actor"] for o in ops} == {"agent"}
    assert all(o["trigger"].startswith("rule:") for o in ops)
    # Idempotent: a second run finds nothing new.
    assert memory_agent_run(conversation=conversation).operations == []
    assert MemoryAgentCursor.objects.get(conversation=conversation).last_seq == 2


def test_an_unfinished_exchange_waits(conversation):
    append(conversation, {"role": "user", "content": "Remember that the build server is ci-7."})
    assert memory_agent_run(conversation=conversation).operations == []
    append(conversation, {"role": "assistant", "content": "Sure", "completed": False})
    assert memory_agent_run(conversation=conversation).operations == []
    append(conversation, {"role": "assistant", "content": "Stored."})
    assert len(memory_agent_run(conversation=conversation).operations) == 1


def test_a_completed_exchange_queues_the_agent_after_commit(
    owner, conversation, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        append(conversation, {"role": "user", "content": "My timezone is Europe/Berlin."})
    assert not ArchivalMemory.objects.exists()  # no exchange completed yet: the agent has not run
    with django_capture_on_commit_callbacks(execute=True):
        append(conversation, {"role": "assistant", "content": "Got it."})
    assert ArchivalMemory.objects.get().subject == "timezone"
    # The next call has it: B6 shows the message whole, so the memory quoting it is not repeated in B5.
    body = context(owner, conversation, user_message="Which timezone am I in?")
    assert "Europe/Berlin" in body["messages"][0]["content"]
    assert all(i["kind"] != "archival" for i in body["blocks"].get("B5", {}).get("items", []))


def test_a_cut_off_reply_marked_completed_queues_the_agent(
    owner, conversation, django_capture_on_commit_callbacks
):
    url = f"/api/v1/conversations/{conversation.id}/messages"
    owner.client.post(url, {"role": "user", "content": "My timezone is Europe/Berlin."}, format="json")
    with django_capture_on_commit_callbacks(execute=True):
        reply = owner.client.post(
            url, {"role": "assistant", "content": "Got", "completed": False}, format="json"
        )
    assert not ArchivalMemory.objects.exists()  # an incomplete reply closes no exchange
    with django_capture_on_commit_callbacks(execute=True):
        owner.client.patch(f"{url}/{reply.json()['id']}", {"completed": True}, format="json")
    assert ArchivalMemory.objects.get().subject == "timezone"


def test_a_burst_of_exchanges_queues_one_delayed_run_that_reads_them_all(
    conversation, settings, monkeypatch, django_capture_on_commit_callbacks
):
    from memory import tasks

    settings.MNEMO_MEMORY_AGENT_DELAY_SECONDS = 10
    queued = []
    monkeypatch.setattr(
        tasks.memory_agent_conversation,
        "apply_async",
        lambda args, countdown: queued.append((args, countdown)),
    )
    for fact in ("My editor is Helix.", "My shell is fish."):
        with django_capture_on_commit_callbacks(execute=True):
            append(
                conversation, {"role": "user", "content": fact}, {"role": "assistant", "content": "Noted."}
            )
    # One run, 10 s after the first exchange; the second exchange is left to it.
    assert queued == [((str(conversation.id),), 10)]
    assert tasks.memory_agent_conversation(str(conversation.id)) == 2
    assert set(ArchivalMemory.objects.values_list("subject", flat=True)) == {"editor", "shell"}
    # The run cleared its mark: the next exchange queues the next run.
    with django_capture_on_commit_callbacks(execute=True):
        append(
            conversation, {"role": "user", "content": "Thanks."}, {"role": "assistant", "content": "Sure."}
        )
    assert len(queued) == 2


def test_what_a_named_speaker_said_is_kept_as_theirs(owner, conversation):
    """Between several people, "I" is whoever spoke: the rules keep who said it."""
    append(
        conversation,
        {"role": "user", "name": "Priya", "content": "My favourite editor is Helix. I prefer tea to coffee."},
        {"role": "assistant", "name": "Tomas", "content": "Noted."},
    )

    memory_agent_run(conversation=conversation)

    contents = set(ArchivalMemory.objects.values_list("content", flat=True))
    assert contents == {"Priya: My favourite editor is Helix", "Priya: I prefer tea to coffee"}
    assert CoreMemoryBlock.objects.get(label="preferences").value == "#1 Priya: I prefer tea to coffee."
