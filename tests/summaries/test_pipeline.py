"""Compaction in the context pipeline: B4 from the live segments, B6 from the last boundary, and no compaction
inside the request. When the history since the boundary passes the background share of the history budget
(the tenant's, or the history's share of the requested budget, at least MIN_COMPACTION_HISTORY_TOKENS, when
that is smaller), the request queues a background compaction and answers with what exists (the window cut
keeps the prompt within its budget meanwhile); the next call shows the new segment. The system message only
ever grows by whole segments between boundaries.

In these tests Celery is eager: a queued compaction runs when the request's transaction commits, which the
test database only does inside django_capture_on_commit_callbacks(execute=True)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from context.budget import MIN_COMPACTION_HISTORY_TOKENS
from context.pipeline import STAGES, context_assemble
from context.state import ContextRequest
from conversations.models import Message
from summaries.conf import compaction_config
from summaries.locks import compaction_lock
from summaries.models import CompactionState
from summaries.selectors import segment_prompt_text, segments_live
from summaries.services import compaction_run
from summaries.tasks import compact_conversation
from tests.context.helpers import exchanges
from tests.summaries.helpers import b6_tokens, budgets, context, history

pytestmark = pytest.mark.django_db

HISTORY_BUDGET = 1000


@pytest.fixture
def small_budget(owner, conversation):
    budgets(owner.tenant, history=HISTORY_BUDGET)
    conversation.refresh_from_db()
    return conversation


@pytest.fixture
def queued(monkeypatch):
    """The compaction tasks the requests queue, held instead of run: (conversation id, trigger, budget)."""
    sent: list[tuple] = []
    monkeypatch.setattr(compact_conversation, "apply_async", lambda args, *_, **__: sent.append(tuple(args)))
    return sent


def grow_to(conversation, share: float, *, start: int = 0, after_seq: int = 0) -> int:
    """Append exchanges until B6 holds at least `share` of the history budget; returns the next index."""
    n = start
    while b6_tokens(conversation, after_seq) < share * HISTORY_BUDGET:
        history(conversation, 1, start=n)
        n += 1
    return n


def boundaries(conversation) -> int:
    return Message.objects.filter(conversation=conversation, kind="compact_boundary").count()


def queued_at(conversation):
    state = CompactionState.objects.filter(pk=conversation.pk).first()
    return state and state.queued_at


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
    assert body["dropped"] == []
    assert [c.__name__ for c in callbacks].count("send") == 1  # one task queued
    # Eager Celery ran the queued task when the request committed.
    assert boundaries(small_budget) == 1
    assert CompactionState.objects.get(pk=small_budget.pk).queued_at is None
    after = context(owner, small_budget)
    assert "B4" in after["blocks"]


def test_past_the_trigger_share_the_request_still_only_queues_and_the_next_call_shows_the_segment(
    owner, small_budget, django_capture_on_commit_callbacks
):
    grow_to(small_budget, 0.8)  # where the request path used to compact synchronously
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        body = context(owner, small_budget)
    # The request answered with what existed: the whole history, no summary, nothing compacted in it.
    assert "B4" not in body["blocks"]
    assert body["window"]["boundary_seq"] == 0
    assert body["dropped"] == []
    assert [c.__name__ for c in callbacks].count("send") == 1
    # The queued compaction ran once the request had committed; the next call shows its segment.
    (segment,) = segments_live(conversation=small_budget)
    assert segment.source == "extractive"  # no LLM configured: the offline summariser served
    after = context(owner, small_budget)
    assert after["window"]["boundary_seq"] == segment.end_seq
    assert [i["id"] for i in after["blocks"]["B4"]["items"]] == [str(segment.id)]
    assert all(item["seq"] > segment.end_seq for item in after["blocks"]["B6"]["items"])
    assert segment_prompt_text(segment) in after["messages"][0]["content"]


def test_no_compaction_runs_inside_the_request_even_far_over_the_allowance(
    owner, small_budget, queued, django_capture_on_commit_callbacks
):
    grow_to(small_budget, 0.9)  # past the tenant's trigger share, and far over a 400-token prompt's history
    budget = 400

    with django_capture_on_commit_callbacks(execute=True):  # the request commits: what it queued is sent
        body = context(owner, small_budget, token_budget=budget)

    # Nothing was summarised while the request ran: no boundary, no segment, no stage but the pipeline's.
    assert boundaries(small_budget) == 0
    assert segments_live(conversation=small_budget) == []
    assert list(body["timings"]) == list(STAGES)
    assert [d for d in body["dropped"] if d.get("reason") == "compacted"] == []
    assert body["window"]["boundary_seq"] == 0
    # The window cut (prompt only) keeps the prompt within its budget meanwhile.
    assert [d["reason"] for d in body["dropped"] if d["block"] == "B6"] == ["budget"]
    assert body["tokens"]["total"] <= budget
    assert body["degradations"] == []
    # One compaction was queued, sized by the tenant's history budget (it is under the floor the request's
    # history allowance is raised to: MIN_COMPACTION_HISTORY_TOKENS).
    assert HISTORY_BUDGET < MIN_COMPACTION_HISTORY_TOKENS
    assert queued == [(str(small_budget.pk), "auto", HISTORY_BUDGET)]
    assert queued_at(small_budget) is not None

    # The worker runs it; the next call, at the same budget, answers from the new boundary.
    compact_conversation.apply(args=queued[0])
    (segment,) = segments_live(conversation=small_budget)
    after = context(owner, small_budget, token_budget=budget)
    assert after["window"]["boundary_seq"] == segment.end_seq
    shown = [i["id"] for i in after["blocks"].get("B4", {}).get("items", [])]
    given_way = [d["source"]["id"] for d in after["dropped"] if d["block"] == "B4"]
    assert shown + given_way == [str(segment.id)]  # shown, or listed where its share is too small
    assert after["tokens"]["total"] <= budget


def test_while_a_compaction_is_queued_a_cut_window_does_not_sum_the_history_again(
    owner, small_budget, queued, django_capture_on_commit_callbacks
):
    """A queued compaction that lags (no worker yet) would otherwise have every call sum the tokens of the
    whole history since the boundary, to find only that a compaction is needed."""
    grow_to(small_budget, 0.9)
    with django_capture_on_commit_callbacks(execute=True):
        context(owner, small_budget, token_budget=400)
    assert len(queued) == 1 and queued_at(small_budget) is not None
    with CaptureQueriesContext(connection) as captured:
        body = context(owner, small_budget, token_budget=400)
    assert body["window"]["window_start_seq"] > body["window"]["boundary_seq"]  # B6 starts after a cut
    assert not [q["sql"] for q in captured if 'SUM("conversations_message"."token_count")' in q["sql"]]
    assert len(queued) == 1


def test_a_small_request_budget_asks_for_compaction_only_past_the_share_of_the_minimum(
    owner, conversation, queued, django_capture_on_commit_callbacks
):
    """At a small budget the window cut and retrieval over the whole history serve better than ever smaller
    summaries: compaction is asked for at the background share of MIN_COMPACTION_HISTORY_TOKENS, not of the
    history's small allowance."""
    cfg = compaction_config(conversation)
    threshold = int(cfg.background * MIN_COMPACTION_HISTORY_TOKENS)  # 0.6 × 4,000 = 2,400
    assert cfg.history_budget > MIN_COMPACTION_HISTORY_TOKENS  # the tenant's own budget does not cap it
    exchanges(conversation, threshold // 200 - 1, tokens=100)  # 2,200 tokens, far over a 1,000 budget's
    with django_capture_on_commit_callbacks(execute=True):
        body = context(owner, conversation, user_message="What next?", token_budget=1000)
    # The window is cut (and the newest exchange may be shortened to its heads: at 1,000 tokens retrieval's
    # share leaves the history little).
    assert [(d["block"], d["reason"]) for d in body["dropped"] if d["reason"] != "shortened"] == [
        ("B6", "budget")
    ]
    assert queued == []
    assert queued_at(conversation) is None

    exchanges(conversation, 2, tokens=100)  # 2,600 ≥ 2,400
    with django_capture_on_commit_callbacks(execute=True):
        context(owner, conversation, user_message="What next?", token_budget=1000)
    assert queued == [(str(conversation.pk), "auto", MIN_COMPACTION_HISTORY_TOKENS)]


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


def test_the_prefix_is_stable_between_compactions_and_b4_only_grows(
    owner, small_budget, django_capture_on_commit_callbacks
):
    background = compaction_config(small_budget).background
    n = grow_to(small_budget, background)
    with django_capture_on_commit_callbacks(execute=True):
        context(owner, small_budget)  # queues the first compaction, which runs after it
    first = context(owner, small_budget)
    second = context(owner, small_budget)
    assert first["window"]["boundary_seq"] > 0
    assert second["messages"] == first["messages"]
    assert second["prefix"]["hashes"] == first["prefix"]["hashes"]

    history(small_budget, 1, start=n)
    third = context(owner, small_budget)  # below the background share again: B6 grew, nothing moved
    assert third["window"] == first["window"]
    assert third["messages"][0] == first["messages"][0]
    assert third["messages"][: len(first["messages"]) - 1] == first["messages"][:-1]

    grow_to(small_budget, background, start=n + 1, after_seq=third["window"]["boundary_seq"])
    with django_capture_on_commit_callbacks(execute=True):
        context(owner, small_budget)  # queues the second compaction
    fourth = context(owner, small_budget)  # which appended a segment
    assert fourth["window"]["boundary_seq"] > third["window"]["boundary_seq"]
    assert fourth["messages"][0]["content"].startswith(first["messages"][0]["content"] + "\n\n[Messages ")


def test_a_dry_run_never_compacts_nor_queues(small_budget, queued):
    grow_to(small_budget, 0.9)
    state = context_assemble(
        conversation=small_budget, request=ContextRequest(user_message="hi", record=False)
    )
    assert state.layout.summaries == []
    assert boundaries(small_budget) == 0
    assert queued == []
    assert queued_at(small_budget) is None


def test_a_background_run_holding_the_lock_neither_blocks_nor_degrades_the_request(
    owner, small_budget, django_capture_on_commit_callbacks
):
    grow_to(small_budget, 0.85)
    with (
        compaction_lock(small_budget.pk, ttl=60),
        django_capture_on_commit_callbacks(execute=True) as callbacks,
    ):
        body = context(owner, small_budget, token_budget=400)
    # The request never takes the lock: it answers with the window cut, and nothing is degraded.
    assert body["degradations"] == []
    assert [d["reason"] for d in body["dropped"] if d["block"] == "B6"] == ["budget"]
    assert body["tokens"]["total"] <= 400
    # The queued task found the lock held and left the work to the run holding it: no failure, no boundary.
    assert [c.__name__ for c in callbacks].count("send") == 1
    state = CompactionState.objects.get(pk=small_budget.pk)
    assert (state.failures, state.queued_at) == (0, None)
    assert boundaries(small_budget) == 0


def test_a_failed_background_compaction_is_recorded_and_the_next_call_still_answers(
    owner, small_budget, monkeypatch, django_capture_on_commit_callbacks
):
    from summaries.services.compaction import records as compaction_records
    from summaries.services.compaction import write as compaction_write

    events: list[str] = []
    real_publish = compaction_records.event_publish

    def publish(**kwargs):
        events.append(kwargs["event"])
        real_publish(**kwargs)

    def broken(**kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(compaction_records, "event_publish", publish)
    monkeypatch.setattr(compaction_write, "compaction_records_append", broken)
    grow_to(small_budget, 0.85)
    with django_capture_on_commit_callbacks(execute=True):
        body = context(owner, small_budget, token_budget=400)
    # The request did not compact, so it did not fail: it answered with the window cut.
    assert body["degradations"] == []
    assert [d["reason"] for d in body["dropped"] if d["block"] == "B6"] == ["budget"]
    # The background run that failed after it is counted and published.
    state = CompactionState.objects.get(pk=small_budget.pk)
    assert state.failures == 1 and "disk full" in state.last_error
    assert events[-1] == "compaction.failed"
    assert boundaries(small_budget) == 0

    after = context(owner, small_budget, token_budget=400)
    assert after["window"]["boundary_seq"] == 0
    assert after["window"]["window_start_seq"] == body["window"]["window_start_seq"] > 0
    assert after["blocks"]["B6"]["from_seq"] > after["window"]["window_start_seq"]
    assert after["tokens"]["total"] <= 400


def test_the_request_budget_is_remembered_and_the_summaries_are_rolled_up_to_its_share(
    owner, member, client, conversation, django_capture_on_commit_callbacks
):
    """Summaries written for a larger budget are over B4's share of a small request's room: that request
    drops them, and the compaction it queues remembers its budgets and rolls the summaries up until they fit,
    so the next call at that budget shows B4 instead of dropping it."""
    history(conversation, 40)
    compaction_run(conversation=conversation, trigger="manual")  # at the tenant's budgets
    history(conversation, 40, start=40)
    compaction_run(conversation=conversation, trigger="manual")
    live = sum(s.token_count for s in segments_live(conversation=conversation))

    history(conversation, 60, start=80)  # past the background share of the minimum history budget
    with django_capture_on_commit_callbacks(execute=True):
        before = context(owner, conversation, token_budget=3000)
    assert "B4" not in before["blocks"]
    dropped = sum(d["tokens"] for d in before["dropped"] if d["block"] == "B4")
    assert dropped == live

    state = CompactionState.objects.get(pk=conversation.pk)
    assert state.compactions == 3 and state.history_budget == MIN_COMPACTION_HISTORY_TOKENS
    assert 0 < state.summary_budget < live
    assert sum(s.token_count for s in segments_live(conversation=conversation)) <= state.summary_budget
    shown = owner.client.get(f"/api/v1/conversations/{conversation.pk}/summaries").json()["compaction"]
    assert (shown["history_budget"], shown["summary_budget"]) == (state.history_budget, state.summary_budget)
    client.force_login(member.user)
    page = client.get(reverse("admin:conversations_conversation_change", args=[conversation.pk]))
    assert f"summaries rolled up to fit {state.summary_budget} tokens" in page.content.decode()

    after = context(owner, conversation, token_budget=3000)
    assert after["blocks"]["B4"]["items"] and not [d for d in after["dropped"] if d["block"] == "B4"]
    assert after["tokens"]["total"] <= 3000
    # B4's cap does not shrink with a longer question: the summaries (and the cached prefix) stay.
    longer = context(owner, conversation, token_budget=3000, user_message="And what next? " * 300)
    assert longer["messages"][0] == after["messages"][0]
