"""Retrieval (B5) against the budget: recall reads this conversation up to the newest exchanges, so a message
the budget cuts out of B6 can come back as the part that matches the question; held-back hits beyond top_k
fill only the room a history cut leaves; nothing B6 still sends is repeated in B5."""

import pytest

from context.models import ConversationContext
from context.sources import DEFAULT_TOP_K
from summaries.services import compaction_run
from tests.context.helpers import append, context, exchanges

pytestmark = pytest.mark.django_db

FACT = "The staging deploy key for ledger is QW-4821, Priya rotated it this morning."


def b5_sources(body):
    return body["blocks"].get("B5", {}).get("items", [])


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


def test_nothing_b6_still_sends_is_repeated_and_held_back_hits_fill_only_a_cut_history(owner, conversation):
    notes = []
    for n in range(1, 15):
        notes.append(
            {"role": "user", "content": f"Ledger replica lag note {n}: the ledger lag was {n * 7} seconds."}
        )
        notes.append({"role": "assistant", "content": f"Recorded lag note {n}."})
    stored = append(conversation, *notes)
    exchanges(conversation, 20, tokens=100)
    ask = "What was the ledger replica lag?"

    whole = context(owner, conversation, user_message=ask, retrieval={"top_k": 2})
    assert not [d for d in whole["dropped"] if d["block"] == "B6"]
    # Every matching message is in the history the prompt sends: B5 repeats none of them.
    assert b5_sources(whole) == []

    cut = context(owner, conversation, user_message=ask, retrieval={"top_k": 2}, token_budget=1500)
    window_start = cut["window"]["window_start_seq"]
    items = b5_sources(cut)
    # More than top_k: the held-back hits fill the room the cut left, and only with messages it left out.
    assert len(items) > 2
    assert all(i["seq"] <= window_start for i in items)
    assert {i["id"] for i in items} <= {str(m.id) for m in stored}
    assert cut["tokens"]["total"] <= 1500


def test_an_uncut_prompt_keeps_its_top_k(owner, conversation):
    """Hits before the boundary with the whole window sent: top_k, no more, however much room is left."""
    notes = [
        {"role": "user", "content": f"Ledger replica lag note {n}: the ledger lag was {n * 7} seconds."}
        for n in range(1, 15)
    ]
    append(conversation, *notes)
    exchanges(conversation, 20)
    compaction_run(conversation=conversation, trigger="manual", sync=True)
    exchanges(conversation, 2)
    body = context(owner, conversation, user_message="What was the ledger replica lag?", token_budget=30_000)
    assert not [d for d in body["dropped"] if d["block"] == "B6"]
    assert ConversationContext.objects.get(conversation=conversation).window_start_seq == 0
    assert 0 < len(b5_sources(body)) <= DEFAULT_TOP_K
