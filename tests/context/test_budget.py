"""The budget stage, by value (DESIGN.md, Budget). Of the room B1, core memory and the current message leave,
the summaries (B4) keep at most SUMMARY_SHARE (the oldest segments give way), the history (B6) gets what
RETRIEVAL_SHARE, the capped B4, B3 and B2b leave (cut once from the oldest end to WINDOW_REFILL of that
allowance and remembered; the newest exchange is never cut, only shortened with a marker), and retrieval (B5)
fills the rest with its best hits. Only when that is still over do B4, then B2b give way and B3 is truncated
with a marker; B1 is never dropped, and when it and the newest exchange alone do not fit, `over_budget` says
so. History is budgeted with the stored token_count, never re-tokenised.

The mechanism is tested with fixed shares (the ones these hand computations were made with); the shipped
values are tuned on the quality benchmark (bench/evidence_recall.py) and may move."""

import re

import pytest

from context import budget as budget_rules
from context.budget import SEPARATOR_TOKENS, WINDOW_REFILL
from context.history import PROTECTED_EXCHANGES
from context.models import ConversationContext
from context.pipeline import context_assemble
from context.services import agent_profile_create
from context.state import ContextRequest
from conversations.models import Conversation, Message
from providers import tokens as tokens_module
from providers.tokens import REPLY_PRIMING_TOKENS, count_chat
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

RETRIEVAL_SHARE = 0.4
SUMMARY_SHARE = 0.2


@pytest.fixture(autouse=True)
def fixed_shares(monkeypatch):
    monkeypatch.setattr(budget_rules, "RETRIEVAL_SHARE", RETRIEVAL_SHARE)
    monkeypatch.setattr(budget_rules, "SUMMARY_SHARE", SUMMARY_SHARE)


TRUNCATION_MARKER = "\n[… task state truncated"
SHORTENED = re.compile(r"\n\[… message #(\d+) shortened here: about (\d+) more tokens\]$")


def words(word: str, count: int) -> str:
    return " ".join([word] * count)


def history_texts(body):
    return [m["content"] for m in body["messages"] if m["role"] != "system"][:-1]


def room(budget: int, question: str) -> int:
    """What the fixed costs leave when there is no agent profile or core memory: the budget less the
    current message and the reply priming (the pipeline counts a token or so less, never more)."""
    return budget - user_tokens(question) - REPLY_PRIMING_TOKENS


def b5_tokens(body) -> int:
    return sum(i["tokens"] for i in body["blocks"].get("B5", {}).get("items", []))


def test_retrieval_fills_the_room_left_best_first_and_lists_what_did_not_fit_once(
    owner, conversation, monkeypatch
):
    exchanges(conversation, 1, tokens=100)
    alpha = item(words("alpha", 120), kind="chunk", id="alpha", score=0.9)
    beta = item(words("beta", 120), kind="chunk", id="beta", score=0.1)
    gamma = item(words("gamma", 120), kind="chunk", id="gamma", score=0.5)
    install_blocks(monkeypatch, retrieved=[alpha, beta, gamma])
    question = "What do the docs say?"

    full = context(owner, conversation, user_message=question)
    assert full["dropped"] == []
    assert [i["id"] for i in full["blocks"]["B5"]["items"]] == ["alpha", "gamma", "beta"]  # best first
    # The total with alpha alone: only the current message changes.
    ask = "\n\n## User question\n" + question
    all_three = section("## Retrieved context", alpha.text, gamma.text, beta.text) + ask
    alpha_only = section("## Retrieved context", alpha.text) + ask
    alpha_total = full["tokens"]["total"] - user_tokens(all_three) + user_tokens(alpha_only)
    # Half an item more than that: gamma (the next best) no longer fits, and beta does not either.
    budget = alpha_total + gamma.tokens // 2
    # Hand computation: room = budget − 10 (question) − 3 ≈ 393; the history's allowance is what the
    # retrieval share leaves, 393 − 157 = 236, so the 200 history tokens stay whole; B5 then has
    # budget − 213 ≈ 192 tokens: alpha (120 + its title) fits, gamma and beta (120 each) do not.
    assert room(budget, question) - int(room(budget, question) * RETRIEVAL_SHARE) >= 200

    body = context(owner, conversation, user_message=question, token_budget=budget)
    assert body["dropped"] == [
        {
            "block": "B5",
            "reason": "budget",
            "items": 2,
            "tokens": beta.tokens + gamma.tokens,
            "best_score": 0.5,
        }
    ]
    assert body["messages"][-1]["content"] == alpha_only
    assert body["tokens"]["total"] == alpha_total <= budget
    assert body["tokens"]["history"] == 200
    assert body["degradations"] == []


def test_a_weaker_item_that_fits_is_placed_after_a_stronger_one_that_does_not(
    owner, conversation, monkeypatch
):
    exchanges(conversation, 1, tokens=100)
    best = item(words("kept", 80), kind="chunk", id="best", score=0.9)
    big = item(words("junk", 400), kind="chunk", id="big", score=0.5)
    small = item(words("tiny", 50), kind="chunk", id="small", score=0.1)
    install_blocks(monkeypatch, retrieved=[best, big, small])
    # Room ≈ 690, allowance 414: the 200 history tokens stay; B5 has 700 − 210 = 490: best (≈ 97 with the
    # title) leaves ≈ 393, too little for big (402), enough for small (52).
    body = context(owner, conversation, user_message="What next?", token_budget=700)
    assert [i["id"] for i in body["blocks"]["B5"]["items"]] == ["best", "small"]
    assert body["dropped"] == [
        {"block": "B5", "reason": "budget", "items": 1, "tokens": big.tokens, "best_score": 0.5}
    ]
    assert body["tokens"]["total"] <= 700


def test_the_history_the_prompt_shows_does_not_depend_on_the_question(owner, conversation, monkeypatch):
    exchanges(conversation, 6, tokens=100)  # seqs 1..12, 1,200 history tokens
    question, budget = "What next?", 700
    # Hand computation: room = 700 − 7 − 3 = 690; allowance = 690 − 0.4 × 690 = 414 < 1,200, so the window is
    # cut to WINDOW_REFILL of it (248): the newest two messages (seqs 11, 12), whatever the question finds.
    allowance = room(budget, question) - int(room(budget, question) * RETRIEVAL_SHARE)
    assert (allowance, int(allowance * WINDOW_REFILL)) == (414, 248)

    def dry_run():  # the inspector's dry run: nothing is remembered, each run cuts from the same state
        request = ContextRequest(user_message=question, token_budget=budget, record=False)
        state = context_assemble(conversation=conversation, request=request)
        return (
            [m.seq for m in state.layout.history],
            [d.data() for d in state.dropped if d.block == "B6"],
            state,
        )

    without_hits = dry_run()
    install_blocks(
        monkeypatch, retrieved=[item(words("kept", 300), kind="chunk", id=f"c{n}", score=n) for n in (1, 2)]
    )
    with_hits = dry_run()
    assert (
        with_hits[:2]
        == without_hits[:2]
        == (
            [11, 12],
            [
                {
                    "block": "B6",
                    "reason": "budget",
                    "from_seq": 1,
                    "to_seq": 10,
                    "messages": 10,
                    "tokens": 1000,
                }
            ],
        )
    )
    assert without_hits[2].layout.retrieved == []

    # Retrieval takes what the history leaves: one of the two hits (302 + 302 > 700 − 210).
    body = context(owner, conversation, user_message=question, token_budget=budget)
    assert [i["id"] for i in body["blocks"]["B5"]["items"]] == ["c2"]
    assert [d["block"] for d in body["dropped"]] == ["B6", "B5"]
    assert body["tokens"]["total"] <= budget


def grow_within_the_window(owner, conversation, previous, *, question: str, budget: int) -> None:
    """Exchanges 7 and 8 (100 tokens a message) fit the history's allowance: the window stays at seq 6 and
    each prompt extends the previous one."""
    for n in (7, 8):
        append(
            conversation,
            {"role": "user", "content": f"exchange {n} question"},
            {"role": "assistant", "content": f"exchange {n} answer"},
        )
        Message.objects.filter(conversation=conversation, seq__gt=2 * n - 2).update(token_count=100)
        grown = context(owner, conversation, user_message=question, token_budget=budget)
        assert [d for d in grown["dropped"] if d["block"] == "B6"] == []
        assert grown["window"]["window_start_seq"] == 6
        kept = previous["messages"][:-1]
        assert grown["messages"][: len(kept)] == kept
        previous = grown


def test_history_is_cut_once_to_its_refill_share_and_the_window_then_holds(owner, conversation):
    exchanges(conversation, 6, tokens=100)  # seqs 1..12, 1,200 history tokens
    question = "next question"
    budget = 2000
    # Hand computation: room = 2,000 − 6 − 3 = 1,991; the history's allowance is what the retrieval share
    # leaves, 1,991 − 796 = 1,195 < 1,200, so the oldest messages are cut in one step to WINDOW_REFILL of
    # it: 0.6 × 1,195 = 717 → the newest seven (700) less seq 6, an answer, so the window starts on a user
    # message: seqs 7..12 (600).
    allowance = room(budget, question) - int(room(budget, question) * RETRIEVAL_SHARE)
    assert (allowance, int(allowance * WINDOW_REFILL), PROTECTED_EXCHANGES) == (1195, 717, 1)

    first = context(owner, conversation, user_message=question, token_budget=budget)
    assert [d for d in first["dropped"] if d["block"] == "B6"] == [
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
    # The questions the cut left out match this one: they come back through retrieval, not the window,
    # each with its answer.
    items = first["blocks"]["B5"]["items"]
    assert {i["seq"] for i in items} == {1, 2, 3, 4, 5, 6}
    assert {i["seq"]: i.get("neighbour_of") for i in items if i["seq"] % 2 == 0} == {2: 1, 4: 3, 6: 5}

    # Same state: nothing moves, the prompt is byte-identical and its whole prefix is a cache hit.
    second = context(owner, conversation, user_message=question, token_budget=budget)
    assert second["dropped"] == []
    assert dumps(second["messages"]) == dumps(first["messages"])
    assert second["prefix"]["hint_level"] == "B1+B2a+B4+B6"

    # The history grows again without the window moving while it fits its allowance (1,000 tokens).
    grow_within_the_window(owner, conversation, second, question=question, budget=budget)

    # One more exchange (1,200 > 1,195) does not fit: the window moves again, in one step, from where it
    # stood (0.6 × 1,195 = 717 → seqs 13..18).
    append(
        conversation,
        {"role": "user", "content": "exchange 9 question"},
        {"role": "assistant", "content": "a"},
    )
    Message.objects.filter(conversation=conversation, seq__gt=16).update(token_count=100)
    moved = context(owner, conversation, user_message=question, token_budget=budget)
    assert [d for d in moved["dropped"] if d["block"] == "B6"] == [
        {"block": "B6", "reason": "budget", "from_seq": 7, "to_seq": 12, "messages": 6, "tokens": 600}
    ]
    assert ConversationContext.objects.get(conversation=conversation).window_start_seq == 12
    assert moved["tokens"]["total"] <= budget


def test_the_newest_exchange_survives_any_budget_shortened_with_a_marker(owner, conversation):
    messages = exchanges(conversation, 3, tokens=200)  # 1,200 tokens; the newest exchange alone is 400
    body = context(owner, conversation, user_message="q", token_budget=300)
    # Hand computation: room = 300 − 5 − 3 = 292, allowance = 292 − 116 = 176: everything before the newest
    # exchange is cut, and each of its two messages keeps an even share, 176 // 2 = 88 tokens (its head and
    # the marker): about 200 − 88 = 112 tokens of each are left out.
    allowance = room(300, "q") - int(room(300, "q") * RETRIEVAL_SHARE)
    assert (allowance, allowance // 2) == (176, 88)
    newest = messages[-2:]
    assert body["dropped"] == [
        {"block": "B6", "reason": "budget", "from_seq": 1, "to_seq": 4, "messages": 4, "tokens": 800},
        *(
            {"block": "B6", "reason": "shortened", "seq": m.seq, "id": str(m.id), "tokens": 112}
            for m in newest
        ),
    ]
    assert history_texts(body) == [
        f"{m.content}\n[… message #{m.seq} shortened here: about 112 more tokens]" for m in newest
    ]
    assert body["degradations"] == []
    assert body["tokens"]["total"] <= body["token_budget"]


def test_summary_segments_keep_at_most_their_share_oldest_going_first(owner, conversation, monkeypatch):
    exchanges(conversation, 2, tokens=100)
    segments = [item(words(w, 150), kind="summary", id=n) for n, w in enumerate(("red", "green", "blue"), 1)]
    install_blocks(monkeypatch, summaries=segments)
    question = "go on"
    full = context(owner, conversation, user_message=question)
    assert full["dropped"] == []  # at the default budget all three fit their share

    # Hand computation: room = 1,009 − 6 − 3 = 1,000, so B4 keeps at most 0.2 × 1,000 = 200 tokens: the
    # newest segment (150), not two (300). The history's allowance, 1,000 − 400 − 150 = 450, holds its 400.
    budget = 1009
    assert (room(budget, question), int(room(budget, question) * SUMMARY_SHARE)) == (1000, 200)
    body = context(owner, conversation, user_message=question, token_budget=budget)
    assert body["dropped"] == [
        {"block": "B4", "reason": "budget", "source": s.source.data(), "tokens": 150} for s in segments[:2]
    ]
    assert body["system"] == section("## Conversation summary", segments[2].text)
    assert body["tokens"]["history"] == 400
    assert body["tokens"]["total"] <= budget
    assert body["degradations"] == []


def test_when_still_over_b4_then_b2b_give_way_and_b3_is_truncated_and_b1_stays(
    owner, conversation, monkeypatch
):
    profile = agent_profile_create(tenant=owner.tenant, name="Ops", scope="on-call", is_default=True)
    exchanges(conversation, 1)  # a few real tokens: the history is never what gives way here
    install_blocks(
        monkeypatch,
        summaries=[
            item(words("old", 100), kind="summary", id=1),
            item(words("new", 100), kind="summary", id=2),
        ],
        session_profile=item(words("locale", 60), kind="session_profile"),
        # Even text: one cut by characters per token lands under the budget.
        task_state=item(words("pending", 700), kind="task_state", epoch=1),
    )
    budget = 700
    body = context(owner, conversation, user_message="What next?", token_budget=budget)

    # The oldest segment is over B4's share (≈ 0.2 × 676 = 135 of the 200); then B4, B2b and B3 in turn,
    # since the task state alone is over what is left.
    assert [(d["block"], d["source"].get("id")) for d in body["dropped"]] == [
        ("B4", 1),
        ("B4", 2),
        ("B2b", None),
        ("B3", None),
    ]
    assert body["dropped"][-1]["truncated"] is True
    assert body["system"] == profile.render()
    assert history_texts(body) == ["exchange 1 question", "exchange 1 answer"]
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
    install_blocks(monkeypatch, task_state=item(task_state, kind="task_state"))
    body = context(owner, conversation, user_message="hi", token_budget=300)
    assert body["dropped"][0]["block"] == "B3"
    assert TRUNCATION_MARKER in body["messages"][-1]["content"]
    assert body["tokens"]["total"] <= 300
    assert body["degradations"] == []


def test_only_b1_and_the_newest_exchange_over_the_budget_is_reported(owner, conversation):
    policy = words("Always cite the ticket number.", 80)
    profile = agent_profile_create(tenant=owner.tenant, name="Verbose", policy=policy, is_default=True)
    messages = exchanges(conversation, 2, tokens=100)
    body = context(owner, conversation, user_message="status?", token_budget=256)
    assert body["system"] == profile.render()
    # B1 alone is over: the room and the allowance are 0. The newest exchange still shows, each message
    # shortened to the smallest head the pipeline keeps.
    assert [text.split("\n")[0] for text in history_texts(body)] == [
        "exchange 2 question",
        "exchange 2 answer",
    ]
    assert [d["reason"] for d in body["dropped"]] == ["budget", "shortened", "shortened"]
    assert [d.get("seq") for d in body["dropped"][1:]] == [m.seq for m in messages[2:]]
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
    # A question the history does not match: retrieval counts the hits it labels and places, which is not
    # the history's budget.
    body = context(owner, conversation, user_message="fresh topic", token_budget=5000)

    assert body["tokens"]["history"] == 600  # the stored counts, not the ~8 tokens these texts really are
    assert body["blocks"]["B6"]["tokens"] == 600
    assert {i["tokens"] for i in body["blocks"]["B6"]["items"]} == {100}
    assert any("fresh topic" in text for text in seen)  # the spy does see what is counted
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
    # 2,000 history tokens; at 1,750 the allowance is 1,742 − 696 = 1,046 and the refill target
    # (0.6 × 1,046 = 627) ends inside exchange 3, after its tool call.
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


# --- small budgets: retrieval keeps its share (DESIGN.md, Budget) -----------------------------------------


def runbooks(count: int) -> list:
    """`count` retrieval candidates of about 150 tokens each, best first."""
    return [
        item(f"runbook {n}: " + words("step", 146), kind="chunk", id=f"r{n}", score=round(1 - n / 100, 2))
        for n in range(1, count + 1)
    ]


def test_at_a_small_budget_retrieval_keeps_its_share_and_the_oldest_summaries_give_way(
    owner, conversation, monkeypatch
):
    exchanges(conversation, 30, tokens=100)  # 6,000 history tokens
    segments = [
        item(words(w, 340), kind="summary", id=n)
        for n, w in enumerate(("red", "green", "blue", "north", "south"), 1)
    ]  # 1,700 summary tokens
    candidates = runbooks(10)  # about 1,500 tokens of hits
    install_blocks(monkeypatch, summaries=segments, retrieved=candidates)
    question, budget = "Where did we leave the release?", 2000

    body = context(owner, conversation, user_message=question, token_budget=budget)

    # Hand computation: room ≈ 2,000 − 11 − 3 = 1,986. B4 keeps at most 0.2 × 1,986 = 397: the newest
    # segment (340); the four older ones give way, oldest first. The history's allowance is
    # 1,986 − 794 − 340 = 852, refilled to 0.6 × 852 = 511: seqs 57..60 (400). Retrieval has the rest,
    # ≈ 2,000 − 350 − 400 − 14 = 1,236: eight of the ten runbooks, at least its 794-token share.
    share = int(room(budget, question) * RETRIEVAL_SHARE)
    assert b5_tokens(body) >= share
    cap = int(room(budget, question) * SUMMARY_SHARE)
    assert segments[-1].tokens <= cap < 2 * segments[-1].tokens
    assert [d for d in body["dropped"] if d["block"] == "B4"] == [
        {"block": "B4", "reason": "budget", "source": s.source.data(), "tokens": s.tokens}
        for s in segments[:4]
    ]
    assert [i["id"] for i in body["blocks"]["B4"]["items"]] == [5]
    placed = [i["id"] for i in body["blocks"]["B5"]["items"]]
    assert placed == [c.source.id for c in candidates[: len(placed)]]  # the best ones
    [left] = [d for d in body["dropped"] if d["block"] == "B5"]
    assert left == {
        "block": "B5",
        "reason": "budget",
        "items": 10 - len(placed),
        "tokens": sum(c.tokens for c in candidates[len(placed) :]),
        "best_score": candidates[len(placed)].score,
    }
    # What is left unused is less than one more runbook: B5 was filled as far as its items go.
    assert budget - body["tokens"]["total"] < candidates[0].tokens + SEPARATOR_TOKENS
    assert history_texts(body) == [f"exchange {n} {k}" for n in (29, 30) for k in ("question", "answer")]
    assert body["tokens"]["total"] <= budget
    assert body["degradations"] == []


def deploy_log(lines: int, failed_at: int) -> str:
    return "\n".join(
        f"[{n:03d}] deploy step {n}: health check FAILED on ledger-api, exit code 137"
        if n == failed_at
        else f"[{n:03d}] deploy step {n}: pulled image, ran migrations, health check ok"
        for n in range(1, lines + 1)
    )


def test_a_long_reply_in_the_newest_exchange_is_shortened_and_retrieval_keeps_its_share(
    owner, conversation, monkeypatch
):
    exchanges(conversation, 3)
    [_ask, reply] = append(
        conversation,
        {"role": "user", "content": "Paste the whole deploy log, please."},
        {"role": "assistant", "content": deploy_log(170, failed_at=160)},
    )
    assert reply.token_count >= 3000
    candidates = runbooks(5)
    install_blocks(monkeypatch, retrieved=candidates)
    question, budget = "Which step failed its health check?", 2000

    body = context(owner, conversation, user_message=question, token_budget=budget)
    assert body["tokens"]["total"] <= budget
    assert "over_budget" not in [d["code"] for d in body["degradations"]]

    # Hand computation: room ≈ 2,000 − 11 − 3 = 1,986, allowance = 1,986 − 794 = 1,192. The newest exchange
    # alone is over it: the older exchanges are cut, the question stays whole, and the reply keeps an even
    # share, 1,192 // 2 = 596 tokens, its head and the marker.
    allowance = room(budget, question) - int(room(budget, question) * RETRIEVAL_SHARE)
    [cut, shortened] = [d for d in body["dropped"] if d["block"] == "B6"]
    assert (cut["reason"], cut["from_seq"], cut["to_seq"]) == ("budget", 1, 6)
    assert (shortened["reason"], shortened["seq"], shortened["id"]) == ("shortened", reply.seq, str(reply.id))
    assert reply.token_count - allowance // 2 - 1 <= shortened["tokens"] <= reply.token_count - allowance // 2
    [question_text, reply_text] = history_texts(body)
    assert question_text == "Paste the whole deploy log, please."
    marker = SHORTENED.search(reply_text)
    assert marker and (int(marker[1]), int(marker[2])) == (reply.seq, shortened["tokens"])
    assert reply.content.startswith(reply_text[: marker.start()])
    assert [i["tokens"] for i in body["blocks"]["B6"]["items"]][1] <= allowance // 2 + 1
    # Retrieval keeps its share: the runbooks, and the part of the reply the cut left out that answers the
    # question (the whole reply stays retrievable).
    assert b5_tokens(body) >= int(room(budget, question) * RETRIEVAL_SHARE)
    b5 = body["blocks"]["B5"]["items"]
    assert {i["id"] for i in b5} >= {c.source.id for c in candidates}
    assert str(reply.id) in {i["id"] for i in b5}
    assert "health check FAILED on ledger-api" in body["messages"][-1]["content"]
