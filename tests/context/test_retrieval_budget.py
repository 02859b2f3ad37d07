"""Retrieval (B5) against the budget: the candidates come from the whole history, so a message the window cut
left out of B6 can come back as the part that matches the question; they fill, best first, the room the other
blocks leave (no fixed top_k), what did not fit is listed once, and nothing B6 still shows whole is repeated
in B5."""

import pytest

from context import budget as budget_rules
from context.models import ConversationContext
from context.pipeline import context_assemble
from context.state import ContextRequest
from summaries.services import compaction_run
from tests.context.helpers import append, context, exchanges

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fixed_shares(monkeypatch):
    """The shares these tests were written with (the shipped ones are tuned on the benchmark)."""
    monkeypatch.setattr(budget_rules, "RETRIEVAL_SHARE", 0.4)
    monkeypatch.setattr(budget_rules, "SUMMARY_SHARE", 0.2)


FACT = "The staging deploy key for ledger is QW-4821, Priya rotated it this morning."
LAG_ASK = "What was the ledger replica lag?"


def b5_sources(body):
    return body["blocks"].get("B5", {}).get("items", [])


def b5_messages(body) -> list[tuple[int, str]]:
    """(seq, id) of every message B5 quotes, a group of consecutive turns counted turn by turn."""
    return [
        pair
        for item in b5_sources(body)
        if item.get("kind") == "message"
        for pair in zip(item.get("seqs", [item["seq"]]), item.get("ids", [item["id"]]), strict=True)
    ]


def lag_notes(n: int) -> str:
    return f"Ledger replica lag note {n}: the ledger lag was {n * 7} seconds."


def test_a_fact_the_budget_cut_out_of_the_window_comes_back_through_recall(owner, conversation):
    (fact, _) = append(
        conversation, {"role": "user", "content": FACT}, {"role": "assistant", "content": "Noted."}
    )
    exchanges(conversation, 30, tokens=100)

    body = context(
        owner, conversation, user_message="Which key do I need for ledger on staging?", token_budget=1200
    )

    cut = [d for d in body["dropped"] if d["block"] == "B6"]
    assert cut and cut[0]["from_seq"] <= fact.seq <= cut[0]["to_seq"]
    current = body["messages"][-1]["content"]
    assert "QW-4821" in current
    assert any(i.get("seq") == fact.seq for i in b5_sources(body))


def test_nothing_b6_still_shows_is_repeated_and_a_cut_history_comes_back_as_hits(owner, conversation):
    notes = []
    for n in range(1, 15):
        notes.append({"role": "user", "content": lag_notes(n)})
        notes.append({"role": "assistant", "content": f"Recorded lag note {n}."})
    stored = append(conversation, *notes)
    exchanges(conversation, 20, tokens=100)

    whole = context(owner, conversation, user_message=LAG_ASK)
    assert not [d for d in whole["dropped"] if d["block"] == "B6"]
    # Every matching message is in the history the prompt sends: B5 repeats none of them, and none is listed
    # as left out either.
    assert b5_sources(whole) == []
    assert whole["dropped"] == []

    cut = context(owner, conversation, user_message=LAG_ASK, token_budget=1500)
    window_start = cut["window"]["window_start_seq"]
    assert window_start >= stored[-1].seq  # every note is before the window now
    items = b5_messages(cut)
    # The notes come back as hits, as many as the room the history leaves takes (far more than the eight a
    # fixed top_k used to allow), and only messages the cut left out.
    assert len(items) > 8
    assert all(seq <= window_start for seq, _id in items)
    assert {id_ for _seq, id_ in items} <= {str(m.id) for m in stored}
    assert not [d for d in cut["dropped"] if d["block"] == "B5"]  # they all fit
    assert cut["tokens"]["total"] <= 1500


def test_with_room_to_spare_every_hit_is_placed_in_the_order_it_was_said(owner, conversation):
    """Hits before the boundary with the whole window sent: no top_k, every one of them fits (at a budget
    whose retrieval cap, retrieval_cap, leaves room for all of them)."""
    notes = append(conversation, *({"role": "user", "content": lag_notes(n)} for n in range(1, 15)))
    exchanges(conversation, 20)
    compaction_run(conversation=conversation, trigger="manual", sync=True)
    exchanges(conversation, 2)
    body = context(owner, conversation, user_message=LAG_ASK, token_budget=8_000)
    assert not [d for d in body["dropped"] if d["block"] == "B6"]
    assert ConversationContext.objects.get(conversation=conversation).window_start_seq == 0
    seqs = [seq for seq, _id in b5_messages(body)]
    assert set(seqs) == {m.seq for m in notes}
    assert seqs == sorted(seqs)  # B5 reads in the order things were said, not by score
    assert body["dropped"] == []


def test_retrieval_may_fill_small_budgets_and_is_held_small_at_large_ones():
    """B5 sits in the uncached current message: at large budgets the cached history carries the prompt."""
    cap = budget_rules.retrieval_cap
    assert cap(2000) == cap(budget_rules.RETRIEVAL_FILL_BUDGET) == budget_rules.RETRIEVAL_FILL_TOKENS
    assert cap(32000) == cap(budget_rules.RETRIEVAL_LARGE_BUDGET) == budget_rules.RETRIEVAL_LARGE_TOKENS
    middle = (budget_rules.RETRIEVAL_FILL_BUDGET + budget_rules.RETRIEVAL_LARGE_BUDGET) // 2
    assert budget_rules.RETRIEVAL_LARGE_TOKENS < cap(middle) < budget_rules.RETRIEVAL_FILL_TOKENS


def test_retrieval_reads_for_what_b5_can_take_in_this_call_not_for_its_cap(conversation, monkeypatch):
    """At a small budget the cap (8,000 tokens) is far above what the call could ever place: retrieval
    reads hits for the room the fixed blocks leave; at a large budget, for the cap."""
    exchanges(conversation, 2, tokens=50)
    rooms = []
    monkeypatch.setattr("context.pipeline.load_retrieval", lambda state, *, room: rooms.append(room))
    for budget in (1000, 32000):
        request = ContextRequest(user_message="What next?", token_budget=budget, record=False)
        shares = context_assemble(conversation=conversation, request=request).shares
        assert rooms.pop() == min(shares.room, shares.retrieval_cap)
    assert shares.retrieval_room == budget_rules.RETRIEVAL_LARGE_TOKENS
    assert budget_rules.Budget(room=700, retrieval_cap=8000).retrieval_room == 700
