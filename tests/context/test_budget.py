"""The budget stage, block by block: B5 lowest score first → oldest B6 beyond the newest two exchanges (one
step, remembered) → B4 oldest first → B2b → B3 truncated with a marker. B1 and the newest two exchanges are
never dropped; when they alone do not fit, `over_budget` says so. History is budgeted with the stored
token_count, never re-tokenised."""

import pytest

from context.models import ConversationContext
from context.pipeline import PROTECTED_EXCHANGES, WINDOW_REFILL
from context.services import agent_profile_create
from conversations.models import Conversation, Message
from conversations.services import conversation_create
from providers import tokens as tokens_module
from providers.tokens import count_chat, count_text
from tests.context.helpers import (
    MODEL,
    append,
    context,
    dumps,
    exchanges,
    install_blocks,
    item,
    section,
    user_tokens,
)

pytestmark = pytest.mark.django_db

TRUNCATION_MARKER = "\n[… task state truncated"


def words(word: str, count: int) -> str:
    return " ".join([word] * count)


def history_texts(body):
    return [m["content"] for m in body["messages"] if m["role"] != "system"][:-1]


def test_lowest_scored_retrieved_items_go_first_and_only_as_many_as_needed(owner, conversation, monkeypatch):
    exchanges(conversation, 1, tokens=100)
    alpha = item(words("alpha", 120), kind="chunk", id="alpha", score=0.9)
    beta = item(words("beta", 120), kind="chunk", id="beta", score=0.1)
    gamma = item(words("gamma", 120), kind="chunk", id="gamma", score=0.5)
    install_blocks(monkeypatch, b5=[alpha, beta, gamma])
    question = "What do the docs say?"

    full = context(owner, conversation, user_message=question)
    assert full["dropped"] == []
    # The total once beta and gamma are gone: only the current message changes.
    ask = "\n\n## User question\n" + question
    all_three = section("## Retrieved context", alpha.text, beta.text, gamma.text) + ask
    alpha_only = section("## Retrieved context", alpha.text) + ask
    fits = full["tokens"]["total"] - user_tokens(all_three) + user_tokens(alpha_only)

    body = context(owner, conversation, user_message=question, token_budget=fits)
    assert body["dropped"] == [
        {"block": "B5", "reason": "budget", "source": {"kind": "chunk", "id": "beta"}, "tokens": beta.tokens},
        {
            "block": "B5",
            "reason": "budget",
            "source": {"kind": "chunk", "id": "gamma"},
            "tokens": gamma.tokens,
        },
    ]
    assert body["messages"][-1]["content"] == alpha_only
    assert body["tokens"]["total"] == fits
    assert body["tokens"]["history"] == 200
    assert body["degradations"] == []


def test_history_is_cut_once_beyond_the_newest_two_exchanges_and_the_window_then_holds(owner, conversation):
    exchanges(conversation, 6, tokens=100)  # seqs 1..12, 1,200 history tokens
    question = "next question"
    budget = 1100
    # Hand computation: total = 1,200 + user + 3 reply priming; over = total - 1,100; the history keeps
    # WINDOW_REFILL of what would fit, newest first: 0.6 × (1,200 − over) = 654 → six messages (seqs 7..12).
    total = 1200 + user_tokens(question) + 3
    assert (total, int((1200 - (total - budget)) * WINDOW_REFILL), PROTECTED_EXCHANGES) == (1209, 654, 2)

    first = context(owner, conversation, user_message=question, token_budget=budget)
    assert first["dropped"] == [
        {"block": "B6", "reason": "budget", "from_seq": 1, "to_seq": 6, "messages": 6, "tokens": 600}
    ]
    assert ConversationContext.objects.get(conversation=conversation).window_start_seq == 6
    assert first["window"] == {"boundary_seq": 0, "window_start_seq": 6}
    assert history_texts(first) == [
        f"exchange {n} {kind}" for n in (4, 5, 6) for kind in ("question", "answer")
    ]
    assert first["tokens"]["history"] == 600
    assert first["tokens"]["total"] <= budget
    assert (first["blocks"]["B6"]["from_seq"], first["blocks"]["B6"]["to_seq"]) == (7, 12)

    # Same state: nothing moves, the prompt is byte-identical and its whole prefix is a cache hit.
    second = context(owner, conversation, user_message=question, token_budget=budget)
    assert second["dropped"] == []
    assert dumps(second["messages"]) == dumps(first["messages"])
    assert second["prefix"]["hint_level"] == "B1+B2a+B4+B6"

    # The history grows again without the window moving while it fits (1,000 history tokens).
    previous = second
    for n in (7, 8):
        append(
            conversation,
            {"role": "user", "content": f"exchange {n} question"},
            {"role": "assistant", "content": f"exchange {n} answer"},
        )
        Message.objects.filter(conversation=conversation, seq__gt=2 * n - 2).update(token_count=100)
        grown = context(owner, conversation, user_message=question, token_budget=budget)
        assert grown["dropped"] == []
        assert grown["window"]["window_start_seq"] == 6
        kept = previous["messages"][:-1]
        assert grown["messages"][: len(kept)] == kept
        previous = grown

    # One more exchange does not fit: the window moves again, in one step, from where it stood.
    append(
        conversation,
        {"role": "user", "content": "exchange 9 question"},
        {"role": "assistant", "content": "a"},
    )
    Message.objects.filter(conversation=conversation, seq__gt=16).update(token_count=100)
    moved = context(owner, conversation, user_message=question, token_budget=budget)
    assert moved["dropped"] == [
        {"block": "B6", "reason": "budget", "from_seq": 7, "to_seq": 12, "messages": 6, "tokens": 600}
    ]
    assert ConversationContext.objects.get(conversation=conversation).window_start_seq == 12
    assert moved["tokens"]["total"] <= budget


def test_the_newest_two_exchanges_survive_any_budget(owner, conversation):
    exchanges(conversation, 3, tokens=200)  # 1,200 tokens; the newest two exchanges alone are 800
    body = context(owner, conversation, user_message="q", token_budget=300)
    assert body["dropped"] == [
        {"block": "B6", "reason": "budget", "from_seq": 1, "to_seq": 2, "messages": 2, "tokens": 400}
    ]
    assert history_texts(body) == [f"exchange {n} {k}" for n in (2, 3) for k in ("question", "answer")]
    assert [d["code"] for d in body["degradations"]] == ["over_budget"]
    assert body["tokens"]["total"] > body["token_budget"]  # reported honestly, not hidden


def test_summary_segments_go_oldest_first_after_history(owner, conversation, monkeypatch):
    exchanges(conversation, 2, tokens=100)  # all protected
    segments = [item(words(f"seg{n}", 150), kind="summary", id=n) for n in (1, 2, 3)]
    install_blocks(monkeypatch, b4=segments)
    full = context(owner, conversation, user_message="go on")
    system_all = section("## Conversation summary", *(s.text for s in segments))
    system_last = section("## Conversation summary", segments[2].text)
    budget = (
        full["tokens"]["total"] - count_text(system_all, model=MODEL) + count_text(system_last, model=MODEL)
    )

    body = context(owner, conversation, user_message="go on", token_budget=budget)
    assert [(d["block"], d["source"]["id"]) for d in body["dropped"]] == [("B4", 1), ("B4", 2)]
    assert body["system"] == system_last
    assert body["tokens"]["total"] <= budget
    assert body["tokens"]["history"] == 400


def test_trimming_follows_the_order_b5_b6_b4_b2b_b3_and_keeps_b1(owner, conversation, monkeypatch):
    profile = agent_profile_create(tenant=owner.tenant, name="Ops", scope="on-call", is_default=True)
    exchanges(conversation, 4, tokens=100)
    task_state = words("pending", 500)  # even text: one cut by characters per token lands under budget
    install_blocks(
        monkeypatch,
        b5=[
            item(words("kept", 100), kind="chunk", id="high", score=0.8),
            item(words("low", 100), kind="chunk", id="low", score=0.2),
        ],
        b4=[item(words("old", 100), kind="summary", id=1), item(words("new", 100), kind="summary", id=2)],
        b2b=item(words("locale", 60), kind="session_profile"),
        b3=item(task_state, kind="task_state", epoch=1),
    )
    budget = 700
    body = context(owner, conversation, user_message="What next?", token_budget=budget)

    assert [d["block"] for d in body["dropped"]] == ["B5", "B5", "B6", "B4", "B4", "B2b", "B3"]
    assert [d["source"]["id"] for d in body["dropped"][:2]] == ["low", "high"]
    assert body["dropped"][2]["from_seq"] == 1 and body["dropped"][2]["to_seq"] == 4
    assert [d["source"]["id"] for d in body["dropped"][3:5]] == [1, 2]
    assert body["dropped"][6]["truncated"] is True
    assert body["system"] == profile.render()
    assert history_texts(body) == [f"exchange {n} {k}" for n in (3, 4) for k in ("question", "answer")]
    current = body["messages"][-1]["content"]
    assert current.startswith("## Task state\npending pending")
    assert TRUNCATION_MARKER in current
    assert current.endswith("\n\n## User question\nWhat next?")
    assert body["tokens"]["total"] <= budget
    assert body["degradations"] == []


@pytest.mark.parametrize(
    "task_state",
    [
        # A plain counter: early entries are shorter, so the head has fewer characters per token.
        " ".join(f"step {n} ok;" for n in range(200)),
        # Dense identifiers first (~1,400 tokens in ~2,600 characters), then plain words.
        " ".join(f"{n:x}{n * 7919:x}" for n in range(300)) + " " + words("the", 600),
    ],
    ids=["counter", "dense-head"],
)
def test_task_state_truncation_lands_under_the_budget(owner, conversation, monkeypatch, task_state):
    install_blocks(monkeypatch, b3=item(task_state, kind="task_state"))
    body = context(owner, conversation, user_message="hi", token_budget=300)
    assert body["dropped"][0]["block"] == "B3"
    assert TRUNCATION_MARKER in body["messages"][-1]["content"]
    assert body["tokens"]["total"] <= 300
    assert body["degradations"] == []


def test_only_b1_and_the_newest_exchanges_over_the_budget_is_reported(owner, conversation):
    policy = words("Always cite the ticket number.", 80)
    profile = agent_profile_create(tenant=owner.tenant, name="Verbose", policy=policy, is_default=True)
    exchanges(conversation, 2, tokens=100)
    body = context(owner, conversation, user_message="status?", token_budget=256)
    assert body["system"] == profile.render()
    assert len(history_texts(body)) == 4
    assert body["dropped"] == []
    [degradation] = body["degradations"]
    assert (degradation["stage"], degradation["code"]) == ("budget", "over_budget")
    assert body["tokens"]["total"] > 256


def test_history_is_budgeted_with_the_stored_token_count_and_never_retokenised(
    owner, conversation, monkeypatch
):
    exchanges(conversation, 3, tokens=100, label="HISTORY-MARKER")
    seen: list[str] = []
    real_count = tokens_module._count

    def spy(encoder, text):
        seen.append(text)
        return real_count(encoder, text)

    monkeypatch.setattr(tokens_module, "_count", spy)
    body = context(owner, conversation, user_message="fresh question", token_budget=5000)

    assert body["tokens"]["history"] == 600  # the stored counts, not the ~8 tokens these texts really are
    assert body["blocks"]["B6"]["tokens"] == 600
    assert {i["tokens"] for i in body["blocks"]["B6"]["items"]} == {100}
    assert any("fresh question" in text for text in seen)  # the spy does see what is counted
    assert not [text for text in seen if "HISTORY-MARKER" in text]


def test_the_reported_total_is_the_real_openai_prompt_size(owner, conversation):
    agent_profile_create(tenant=owner.tenant, name="Counter", scope="counting", is_default=True)
    exchanges(conversation, 2)
    body = context(owner, conversation, user_message="How many tokens is this?")
    assert body["tokens"]["total"] == count_chat(body["messages"], model=MODEL)


def test_without_a_system_message_the_reported_total_is_the_real_prompt_size(owner, conversation):
    exchanges(conversation, 2)
    body = context(owner, conversation, user_message="How many tokens is this?")
    assert body["tokens"]["total"] == count_chat(body["messages"], model=MODEL)


def test_the_history_cut_lands_on_an_exchange_boundary(owner, conversation):
    items = []
    for n in range(5):
        items += [
            {"role": "user", "content": f"question {n}"},
            {
                "role": "assistant",
                "parts": [{"type": "tool_call", "id": f"c{n}", "name": "f", "arguments": {}}],
            },
            {"role": "tool", "parts": [{"type": "tool_result", "tool_call_id": f"c{n}", "content": "r"}]},
            {"role": "assistant", "content": f"answer {n}"},
        ]
    append(conversation, *items)
    Message.objects.filter(conversation=conversation).update(token_count=100)
    # 2,000 history tokens; at 1,750 the refill target (0.6 × 1,739 = 1,043) ends inside exchange 3.
    body = context(owner, conversation, user_message="next", token_budget=1750)
    assert body["dropped"][0]["block"] == "B6"
    history = body["messages"][:-1]
    called = set()
    for message in history:
        called |= {c["id"] for c in message.get("tool_calls") or []}
        if message["role"] == "tool":
            assert message["tool_call_id"] in called
    assert history[0]["role"] == "user"
    assert body["tokens"]["total"] <= 1750


def test_the_budget_comes_from_the_tenant_settings_or_the_default(owner, conversation):
    assert context(owner, conversation, user_message="hi")["token_budget"] == 32000
    owner.tenant.settings = {"token_budget": 5000}
    owner.tenant.save()
    conversation.refresh_from_db()
    assert context(owner, conversation, user_message="hi")["token_budget"] == 5000
    assert context(owner, conversation, user_message="hi", token_budget=900)["token_budget"] == 900


def test_the_default_budget_of_a_model_whose_reply_may_fill_the_window_is_usable(owner):
    conversation = conversation_create(tenant=owner.tenant, model="gpt-4")
    exchanges(conversation, 2)
    body = context(owner, conversation, user_message="hi")
    assert 256 <= body["token_budget"] <= 8192
    assert body["degradations"] == []


@pytest.fixture
def long_conversation(conversation):
    """1,200 stored messages of 10 tokens: more than one 500-row page of history has to be read."""
    Message.objects.bulk_create(
        Message(
            conversation=conversation,
            seq=seq,
            role=Message.Role.USER if seq % 2 else Message.Role.ASSISTANT,
            content=f"message {seq}",
            token_count=10,
        )
        for seq in range(1, 1201)
    )
    Conversation.objects.filter(pk=conversation.pk).update(last_seq=1200)
    return conversation


def test_a_long_history_is_cut_to_the_budget(owner, long_conversation):
    body = context(owner, long_conversation, user_message="hi", token_budget=2000)
    window_start = ConversationContext.objects.get(conversation=long_conversation).window_start_seq
    assert body["window"]["window_start_seq"] == window_start > 0
    kept = history_texts(body)
    assert kept == [f"message {seq}" for seq in range(window_start + 1, 1201)]
    assert body["tokens"]["history"] == 10 * len(kept)
    assert body["tokens"]["total"] <= 2000
    # The next call reads from the window on and moves nothing.
    again = context(owner, long_conversation, user_message="hi", token_budget=2000)
    assert again["dropped"] == []
    assert dumps(again["messages"]) == dumps(body["messages"])


def test_every_message_left_out_of_a_long_history_is_listed(owner, long_conversation):
    body = context(owner, long_conversation, user_message="hi", token_budget=2000)
    window_start = body["window"]["window_start_seq"]
    assert body["dropped"] == [
        {
            "block": "B6",
            "reason": "budget",
            "from_seq": 1,
            "to_seq": window_start,
            "messages": window_start,
            "tokens": 10 * window_start,
        }
    ]


def test_retrieval_trimmed_first_comes_back_into_the_room_the_history_cut_left(
    owner, conversation, monkeypatch
):
    """B5 goes first while B6 is whole; once B6 is cut, the best trimmed items that now fit return."""
    exchanges(conversation, 6, tokens=100)
    best = item(words("kept", 80), kind="chunk", id="best", score=0.9)
    worst = item(words("junk", 400), kind="chunk", id="worst", score=0.1)
    install_blocks(monkeypatch, b5=[best, worst])
    body = context(owner, conversation, user_message="What next?", token_budget=700)

    assert [d["block"] for d in body["dropped"]] == ["B5", "B6"]
    assert body["dropped"][0]["source"]["id"] == "worst"
    current = body["messages"][-1]["content"]
    assert current == section("## Retrieved context", best.text) + "\n\n## User question\nWhat next?"
    assert body["tokens"]["total"] <= 700
