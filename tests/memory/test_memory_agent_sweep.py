"""The memory agent's catch-up (beat): a conversation whose run was lost (a stopped server's queue, a broker
that was down) is read to the end by the next sweep, and only conversations that need it are queued."""

from datetime import timedelta

import pytest
from django.utils import timezone

from conversations.services import conversation_create
from memory.agent import memory_agent_run
from memory.models import CoreMemoryBlock, MemoryAgentCursor
from memory.selectors import memory_agent_due
from memory.tasks import memory_agent_sweep
from tests.summaries.helpers import append

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("lexical_only")]


def exchange(conversation, text):
    append(conversation, {"role": "user", "content": text}, {"role": "assistant", "content": "Noted."})


def since():
    return timezone.now() - timedelta(hours=1)


def test_a_lost_run_is_redone_by_the_sweep_and_a_compaction_record_does_not_count(owner, conversation):
    exchange(conversation, "Call me Ali. I prefer answers in German.")  # its run was never queued here
    assert memory_agent_due(since=since(), limit=10) == [conversation.pk]
    assert memory_agent_sweep() == 1
    assert MemoryAgentCursor.objects.get(conversation=conversation).last_seq == 2
    assert CoreMemoryBlock.objects.filter(end_user=conversation.end_user).exists()
    assert memory_agent_due(since=since(), limit=10) == []
    assert memory_agent_sweep() == 0
    append(conversation, {"role": "system", "content": "Summary of seq 1-2.", "kind": "compact_summary"})
    assert memory_agent_due(since=since(), limit=10) == []


def test_only_conversations_behind_with_an_end_user_and_recent_activity_are_due(
    owner, outsider, conversation
):
    read = conversation_create(tenant=owner.tenant, end_user_external_id="bob", title="Read to the end")
    exchange(read, "I prefer short answers.")
    memory_agent_run(conversation=read)
    anonymous = conversation_create(tenant=owner.tenant, title="No end user")
    exchange(anonymous, "I prefer short answers.")
    empty = conversation_create(tenant=owner.tenant, end_user_external_id="carol", title="Nothing said")
    waiting = conversation_create(tenant=owner.tenant, end_user_external_id="dave", title="No reply yet")
    append(waiting, {"role": "user", "content": "I prefer short answers."})
    theirs = conversation_create(tenant=outsider.tenant, end_user_external_id="alice", title="Outsider's")
    exchange(theirs, "I prefer long answers.")
    exchange(conversation, "I prefer answers in German.")
    due = memory_agent_due(since=since(), limit=10)
    assert set(due) == {conversation.pk, theirs.pk}  # every tenant's: the sweep works for all of them
    assert not {read.pk, anonymous.pk, empty.pk, waiting.pk} & set(due)
    assert memory_agent_due(since=timezone.now() + timedelta(seconds=1), limit=10) == []
    assert len(memory_agent_due(since=since(), limit=1)) == 1
