"""The budget stage's placing: the summaries within their cap, the history within its allowance
(context/history.py), B5 filled with the best retrieved items that fit, and, only when that is still over,
B4, B2b and B3 giving way. Every drop is listed."""

import dataclasses

from context import sources
from context.budget import SECTION_TOKENS, SEPARATOR_TOKENS, system_message_tokens
from context.dropped import DroppedCount, DroppedItem, ShortenedMessage
from context.history import history_fit
from context.retrieved import quoted_trigrams, repeats
from context.state import ContextState
from prefix_cache.accounting import count_cached
from prefix_cache.provenance import (
    ArchivalSource,
    ItemSource,
    MessageHitSource,
    MessageSource,
    RetrievedSource,
    TaskStateSource,
    TurnGroupSource,
)
from prefix_cache.rendering import Item, current_user_text, system_text
from providers.tokens import REPLY_PRIMING_TOKENS, count_message

_TRUNCATION_MARKER = "\n[… task state truncated to fit the token budget]"


def budget_fit(state: ContextState) -> None:
    """Fit under the budget by value (DESIGN.md, Budget): the summaries keep at most their share, the history
    its allowance (the window moves in one step; the newest exchange is shortened, not dropped, when even it
    does not fit), and retrieval fills the rest with its best hits. Only when that is not enough do B4, B2b
    and B3 give way further. No compaction runs here: one is queued when the history outgrows its share, and
    this request uses what exists. Every drop is listed."""
    layout, shares = state.layout, state.shares
    _cap_summaries(state, shares.summary_cap)
    history_tokens = history_fit(state)
    sources.compaction_schedule(
        state, history_budget=shares.compaction_history, summary_budget=shares.compaction_summaries
    )
    totals = _fill_retrieval(state, history_tokens)
    while totals["total"] > state.budget and layout.summaries:
        _drop(state, "B4", layout.summaries.pop(0))
        totals = exact_total(state, history_tokens)
    if totals["total"] > state.budget and layout.session_profile:
        item, layout.session_profile = layout.session_profile, None
        _drop(state, "B2b", item)
        totals = exact_total(state, history_tokens)
    if totals["total"] > state.budget and layout.task_state:
        _truncate_task_state(state, history_tokens=history_tokens)
        totals = exact_total(state, history_tokens)
    if totals["total"] > state.budget:
        state.degrade(
            "budget",
            "over_budget",
            f"The agent profile, core memory and the current message alone need {totals['total']} tokens; "
            f"the budget is {state.budget}.",
        )
    # Retrieved messages in the order they were said, after the memories.
    layout.retrieved.sort(key=_said_order)
    state.tokens = totals


def _said_order(item: Item[RetrievedSource]) -> tuple[bool, int]:
    """Memories first, then what was said in the order it was said (other sources as seq 0)."""
    source = item.source
    return not isinstance(source, ArchivalSource), source.seq if isinstance(source, MessageSource) else 0


def _drop(state: ContextState, block: str, item: Item[ItemSource], reason: str = "budget") -> None:
    state.dropped.append(DroppedItem(block=block, reason=reason, tokens=item.tokens, source=item.source))


def _cap_summaries(state: ContextState, cap: int) -> None:
    """The oldest segments give way while B4 is over its share (a background roll-up makes them fit again)."""
    layout = state.layout
    while layout.summaries and sum(i.tokens for i in layout.summaries) > cap:
        _drop(state, "B4", layout.summaries.pop(0))


@dataclasses.dataclass
class _Placed:
    added: list[Item[RetrievedSource]]  # what B5 took, in order
    said: set[str]  # the ids of the messages the prompt shows whole
    repeats: list[Item[RetrievedSource]]  # message hits that fitted but said mostly what B5 already quotes


def _fill_retrieval(state: ContextState, history_tokens: int) -> dict[str, int]:
    """B5: the candidates, best first, into the room the other blocks leave (nothing the prompt already
    shows, see _place_retrieval). Sizes are summed (an item and its separator), then the exact count takes
    back the weakest while it is over. What did not fit, and what only repeated, is listed."""
    layout = state.layout
    totals = exact_total(state, history_tokens)
    room = min(state.budget - totals["total"], state.shares.retrieval_cap)
    # A set: B6 is hundreds of messages at large budgets.
    dropped = {d.id for d in state.dropped if isinstance(d, ShortenedMessage)}
    shown = {m.id for m in layout.history if m.id not in dropped}
    placed = _place_retrieval(state, shown, room)
    totals = exact_total(state, history_tokens)
    while placed.added and totals["total"] > state.budget:
        weakest = min(placed.added, key=lambda i: i.score)
        placed.added.remove(weakest)
        layout.retrieved.remove(weakest)
        totals = exact_total(state, history_tokens)
    _list_dropped_hits(state, shown, placed)
    return totals


def _list_dropped_hits(state: ContextState, shown: set[str], placed: _Placed) -> None:
    """One `dropped` entry for the hits that repeated what B5 quotes, one for those that did not fit."""
    in_b5 = {id(i) for i in state.layout.retrieved}
    repeated = {id(i) for i in placed.repeats}
    left = [
        i
        for i in state.candidates
        if id(i) not in in_b5
        and id(i) not in repeated
        and i.source.id not in shown
        and not _quotes_only(i, placed.said)
    ]
    for reason, items in (("repeats", placed.repeats), ("budget", left)):
        if items:
            state.dropped.append(
                DroppedCount(
                    block="B5",
                    reason=reason,
                    tokens=sum(i.tokens for i in items),
                    items=len(items),
                    best_score=max(i.score for i in items),
                )
            )


def _quotes_only(item: Item[RetrievedSource], said: set[str]) -> bool:
    """A memory taken from messages the prompt shows whole (the memory agent's rules keep a statement
    verbatim): it says nothing they do not, and without their date and seq."""
    source = item.source
    return (
        isinstance(source, ArchivalSource)
        and bool(source.source_message_ids)
        and set(source.source_message_ids) <= said
    )


def _place_retrieval(state: ContextState, shown: set[str], room: int) -> _Placed:
    """Place the candidates in order while they fit: a message B6 shows whole is skipped, and so is a message
    hit repeating what B5 quotes (REPEAT_SHARE) and a memory quoting only messages the prompt shows whole
    (one placed before the message it quotes gives its room back)."""
    layout = state.layout
    placed = _Placed(added=[], said=set(shown), repeats=[])
    quoting: list[Item[RetrievedSource]] = []  # the placed memories that quote messages (only they can go)
    quoted: set[tuple[str, str, str]] = set()  # the word trigrams of the message hits placed
    for item in state.candidates:
        source = item.source
        ids = source.ids if isinstance(source, TurnGroupSource) else (source.id,)
        message = isinstance(source, MessageSource)
        if (message and all(i in shown for i in ids)) or _quotes_only(item, placed.said):
            continue
        cost = item.tokens + (SECTION_TOKENS if not layout.retrieved else SEPARATOR_TOKENS)
        if cost > room:
            continue
        trigrams = quoted_trigrams(item) if message else set()
        if repeats(trigrams, quoted):
            placed.repeats.append(item)
            continue
        quoted |= trigrams
        layout.retrieved.append(item)
        placed.added.append(item)
        room -= cost
        if isinstance(source, ArchivalSource) and source.source_message_ids:
            quoting.append(item)
        elif message and not (isinstance(source, MessageHitSource) and source.span is not None):
            placed.said.update(ids)
            for memory in [i for i in quoting if _quotes_only(i, placed.said)]:
                quoting.remove(memory)
                placed.added.remove(memory)
                layout.retrieved.remove(memory)
                room += memory.tokens + SEPARATOR_TOKENS
    return placed


def _truncate_task_state(state: ContextState, *, history_tokens: int) -> None:
    """Keep the longest head of B3 (plus the marker) that fits; tokens per character vary along a text, so
    the cut is found by bisection rather than estimated once."""
    item = state.layout.task_state
    assert item is not None

    def shortened(length: int) -> Item[TaskStateSource]:
        text = item.text[:length] + _TRUNCATION_MARKER
        return Item(text=text, tokens=count_cached(text, model=state.model), source=item.source)

    low, high = 0, len(item.text)
    while low < high:
        middle = (low + high + 1) // 2
        state.layout.task_state = shortened(middle)
        if exact_total(state, history_tokens)["total"] <= state.budget:
            low = middle
        else:
            high = middle - 1
    state.layout.task_state = shortened(low)
    state.dropped.append(
        DroppedItem(
            block="B3",
            reason="budget",
            tokens=item.tokens - state.layout.task_state.tokens,
            source=item.source,
            truncated=True,
        )
    )


def exact_total(state: ContextState, history_tokens: int) -> dict[str, int]:
    """The prompt's tokens as the provider counts them: the system message, the history (its stored counts)
    and the current user message, with the reply priming."""
    layout = state.layout
    system_tokens = system_message_tokens(system_text(layout), model=state.model)
    user_tokens = count_message(role="user", content=current_user_text(layout), model=state.model)
    return {
        "system": system_tokens,
        "history": history_tokens,
        "user": user_tokens,
        "total": system_tokens + history_tokens + user_tokens + REPLY_PRIMING_TOKENS,
    }
