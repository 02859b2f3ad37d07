"""Compaction in the context pipeline: B4 from the live segments, B6 from the last boundary, a background
compaction queued at 60 % of the history budget, a synchronous one at 80 %, and a system message that only
ever grows by whole segments between boundaries."""

import pytest

from context.pipeline import ContextRequest, context_assemble
from conversations.models import Message
from summaries.locks import compaction_lock
from summaries.models import CompactionState
from summaries.selectors import segment_prompt_text, segments_live
from summaries.services import compaction_run
from tests.summaries.helpers import b6_tokens, budgets, context, history

pytestmark = pytest.mark.django_db

HISTORY_BUDGET = 1000


@pytest.fixture
def small_budget(owner, conversation):
    budgets(owner.tenant, history=HISTORY_BUDGET)
    conversation.refresh_from_db()
    return conversation


def grow_to(conversation, share: float, *, start: int = 0) -> int:
    """Append exchanges until B6 holds at least `share` of the history budget; returns the next index."""
    n = start
    while b6_tokens(conversation, 0) < share * HISTORY_BUDGET:
        history(conversation, 1, start=n)
        n += 1
    return n


def boundaries(conversation) -> int:
    return Message.objects.filter(conversation=conversation, kind="compact_boundary").count()


def test_below_the_background_share_nothing_happens(owner, small_budget):
    grow_to(small_budget, 0.3)
    body = context(owner, small_budget)
    assert "B4" not in body["blocks"]
    assert not CompactionState.objects.filter(pk=small_budget.pk, queued_at__isnull=False).exists()
    assert boundaries(small_budget) == 0


def test_at_60_percent_a_background_compaction_is_queued_and_runs_after_the_request(
    owner, small_budget, django_capture_on_commit_callbacks
):
    grow_to(small_budget, 0.6)
    assert b6_tokens(small_budget, 0) < 0.8 * HISTORY_BUDGET
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        body = context(owner, small_budget)
    # The request itself was not blocked: its prompt still holds the whole history.
    assert "B4" not in body["blocks"]
    assert [d for d in body["dropped"] if d.get("reason") == "compacted"] == []
    assert [c.__name__ for c in callbacks].count("send") == 1  # one task queued
    # Eager Celery ran the queued task when the request committed.
    assert boundaries(small_budget) == 1
    assert CompactionState.objects.get(pk=small_budget.pk).queued_at is None
    after = context(owner, small_budget)
    assert "B4" in after["blocks"]


def test_at_80_percent_the_request_compacts_synchronously(owner, small_budget):
    grow_to(small_budget, 0.8)
    body = context(owner, small_budget)
    (compacted,) = [d for d in body["dropped"] if d.get("reason") == "compacted"]
    (segment,) = segments_live(conversation=small_budget)
    assert compacted["segment_ids"] == [str(segment.id)]
    assert body["window"]["boundary_seq"] == segment.end_seq == compacted["to_seq"]
    assert body["blocks"]["B4"]["items"][0]["id"] == str(segment.id)
    assert all(item["seq"] > segment.end_seq for item in body["blocks"]["B6"]["items"])
    assert "offline_summariser" in [d["code"] for d in body["degradations"]]
    assert segment_prompt_text(segment) in body["messages"][0]["content"]


def test_context_after_compaction_is_the_segments_plus_the_messages_after_the_boundary(owner, conversation):
    history(conversation, 20)
    first = compaction_run(conversation=conversation, trigger="manual")
    history(conversation, 10, start=20)
    second = compaction_run(conversation=conversation, trigger="manual")
    history(conversation, 2, start=30)

    body = context(owner, conversation)
    live = segments_live(conversation=conversation)
    assert [i["id"] for i in body["blocks"]["B4"]["items"]] == [str(s.id) for s in live]
    assert [(i["start_seq"], i["end_seq"]) for i in body["blocks"]["B4"]["items"]] == [
        (1, first.end_seq),
        (first.end_seq + 1, second.end_seq),
    ]
    expected_b6 = list(
        Message.objects.filter(conversation=conversation, kind="message", seq__gt=second.end_seq)
        .order_by("seq")
        .values_list("seq", flat=True)
    )
    assert [i["seq"] for i in body["blocks"]["B6"]["items"]] == expected_b6
    system = body["messages"][0]
    assert system["role"] == "system"
    assert system["content"] == "## Conversation summary\n" + "\n\n".join(
        segment_prompt_text(s) for s in live
    )
    # Compaction records never appear as history.
    history_texts = [m["content"] for m in body["messages"][1:-1]]
    assert "Conversation compacted" not in history_texts


def test_the_prefix_is_stable_between_compactions_and_b4_only_grows(owner, small_budget):
    n = grow_to(small_budget, 0.8)
    first = context(owner, small_budget)  # compacts
    second = context(owner, small_budget)
    assert second["messages"] == first["messages"]
    assert second["prefix"]["hashes"] == first["prefix"]["hashes"]

    history(small_budget, 1, start=n)
    third = context(owner, small_budget)  # below the trigger again: B6 grew, nothing moved
    assert third["messages"][0] == first["messages"][0]
    assert third["messages"][: len(first["messages"]) - 1] == first["messages"][:-1]

    grow_to_next = n + 1
    while b6_tokens(small_budget, third["window"]["boundary_seq"]) < 0.8 * HISTORY_BUDGET:
        history(small_budget, 1, start=grow_to_next)
        grow_to_next += 1
    fourth = context(owner, small_budget)  # the second compaction appends a segment
    assert fourth["window"]["boundary_seq"] > third["window"]["boundary_seq"]
    assert fourth["messages"][0]["content"].startswith(first["messages"][0]["content"] + "\n\n[Messages ")


def test_a_dry_run_never_compacts(small_budget):
    grow_to(small_budget, 0.9)
    state = context_assemble(
        conversation=small_budget, request=ContextRequest(user_message="hi", record=False)
    )
    assert state.layout.b4 == []
    assert boundaries(small_budget) == 0


def test_when_a_background_run_holds_the_lock_an_over_budget_prompt_is_cut_instead(owner, small_budget):
    grow_to(small_budget, 0.85)
    with compaction_lock(small_budget.pk, ttl=60):
        body = context(owner, small_budget, token_budget=400)
    assert "compaction_busy" in [d["code"] for d in body["degradations"]]
    assert [d["reason"] for d in body["dropped"] if d["block"] == "B6"] == ["budget"]
    assert boundaries(small_budget) == 0


def test_a_failed_compaction_on_the_request_path_degrades_and_is_recorded(owner, small_budget, monkeypatch):
    from summaries.services import compaction as compaction_module

    def broken(**kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(compaction_module, "compaction_records_append", broken)
    grow_to(small_budget, 0.85)
    body = context(owner, small_budget, token_budget=400)
    assert "compaction_failed" in [d["code"] for d in body["degradations"]]
    assert [d["reason"] for d in body["dropped"] if d["block"] == "B6"] == [
        "budget"
    ]  # the window cut instead
    state = CompactionState.objects.get(pk=small_budget.pk)
    assert state.failures == 1 and "disk full" in state.last_error
    assert boundaries(small_budget) == 0
