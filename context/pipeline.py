"""The context pipeline: load → overlay → rewrite → retrieve → decay → budget → render → hint over one
state object. Each stage records its time and any fallback it took (degradations).

Blocks come from sources (context/sources.py); a block whose source is not built is absent, never faked.
"""

import dataclasses
import functools
import json
import logging
import time
import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Min, Sum, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from context import sources
from context.decay import attachments_decay
from context.images import attach_images
from context.lines import SPOKEN_ROLES, turn_text
from context.models import AgentProfile, ConversationContext
from context.retrieved import load_retrieval, quoted_trigrams, repeats
from context.state import ContextRequest, ContextState
from conversations.models import Conversation, Message
from prefix_cache.accounting import count_cached
from prefix_cache.rendering import HistoryMessage, Item, canonical_json, render, sha256
from prefix_cache.rendering import system_sections as render_system_sections
from prefix_cache.services import PrefixLevel, PrefixMatch, cache_usage_open, prefix_hints_record
from prefix_cache.usage import cacheable_tokens
from providers.embeddings import embed_query_ahead
from providers.faults import service_faults
from providers.model_table import ModelInfo, is_known_model, model_info
from providers.tokens import MESSAGE_OVERHEAD_TOKENS, REPLY_PRIMING_TOKENS, count_message, truncate_text
from retrieval.questions import focused
from tenants.errors import ApplicationError
from tenants.settings_schema import settings_read
from tenants.statements import FixedQuery

logger = logging.getLogger(__name__)

STAGES = ("load", "overlay", "rewrite", "retrieve", "decay", "budget", "render", "hint")
PROVIDER_FORMAT = {"openai": "openai", "anthropic": "anthropic", "google": "gemini"}
LEVELS = ("B1", "B1+B2a", "B1+B2a+B4", "B1+B2a+B4+B6")
# After a forced cut the history keeps this share of its allowance, so it can grow for several turns before
# the window has to move again (and the prompt prefix stays byte-identical meanwhile).
WINDOW_REFILL = 0.6
# The newest exchanges B6 always shows (shortened, when even they do not fit their share).
PROTECTED_EXCHANGES = 1
# Estimates for filling B5 (the exact count checks after): a "\n\n" between items; the section's title and
# the question's own title when B5 was empty.
SEPARATOR_TOKENS = 2
SECTION_TOKENS = 16
# Budget by value: of what B1, core memory and the current message leave (the room), retrieval keeps this
# share when the question has hits, the summaries (B4) at most SUMMARY_SHARE, and the history (B6) the rest.
# BEAM-128K (all 20, in-process on a copy of one load, with the ranking of 2026-11-26): 0.75 -> 0.8 -> 0.85
# -> 0.9 gave ER 0.743 -> 0.748 -> 0.752 -> 0.752 at 2,000 tokens and 0.888 -> 0.892 -> 0.896 -> 0.898 at
# 8,000, while B6 went 1,068 -> 750 -> 419 -> 216 tokens at 8,000 (197 -> 147 -> 94 -> 88 at 2,000). At 0.85
# a BEAM reply (977 tokens on average) in the newest exchange is shortened to its head at 8,000 too (360 of
# 400 calls, 40 at 0.75), as the newest exchange is at 2,000: what it said that matches the question comes
# back through B5. 0.9 would leave B6 half of that for 0.002.
RETRIEVAL_SHARE = 0.85
SUMMARY_SHARE = 0.1
# How much B5 may take (retrieval_cap): all the free room up to RETRIEVAL_FILL_TOKENS at budgets up to
# RETRIEVAL_FILL_BUDGET, RETRIEVAL_LARGE_TOKENS from RETRIEVAL_LARGE_BUDGET on (bench/prefix_cache.py).
RETRIEVAL_FILL_BUDGET = 8000
# At 8,000 the cap was 6,000: ~950 tokens of an 8,000 prompt stayed empty (B6 and B4 had what they may take);
# all of it raised ER at 8,000 on BEAM-128K 0.817 -> 0.830, every category up or level (2,000 unchanged).
RETRIEVAL_FILL_TOKENS = 8000
RETRIEVAL_LARGE_BUDGET = 24000
RETRIEVAL_LARGE_TOKENS = 400
# A shortened history message keeps at least this many tokens (its head).
MIN_CUT_TOKENS = 48
# Compaction is asked for when the history since the boundary passes the background share of this many
# tokens or of the history's share of the requested budget, whichever is more: below it, the window cut
# (prompt only) and retrieval over the whole history serve small budgets better than ever smaller summaries.
MIN_COMPACTION_HISTORY_TOKENS = 4000
# The summaries' budget a request remembers for compaction: this share of B4's cap (summary_cap; core memory
# grows a little between compactions, and the cap with it shrinks), but at least MIN_SUMMARY_BUDGET, which
# two segments of the summariser's least (64 tokens) fit.
SUMMARY_FILL = 0.9
MIN_SUMMARY_BUDGET = 128


# --- set-up -----------------------------------------------------------------------------------------------


MIN_BUDGET = 256


def default_budget(*, tenant_settings: dict[str, Any], info: ModelInfo) -> int:
    """The configured budget, capped by the window less room for the reply. Models whose reply may fill the
    whole window (gpt-4: 8,192 and 8,192) reserve a quarter of it instead of leaving nothing."""
    reserve = (
        info.max_output_tokens if info.max_output_tokens < info.context_window else info.context_window // 4
    )
    configured = tenant_settings.get("token_budget") or settings.MNEMO_DEFAULT_TOKEN_BUDGET
    return max(MIN_BUDGET, min(int(configured), info.context_window - reserve))


def system_message_tokens(text: str, *, model: str) -> int:
    """Tokens of the system message as sent: its text (memoised) plus the role and per-message overhead."""
    if not text:
        return 0
    return count_cached(text, model=model) + count_message(role="system", content="", model=model)


# Every call's first reads, as fixed statements (tenants.statements): compiling cost more than running them.
_CONTEXT_STATE = FixedQuery(
    lambda conversation_id: ConversationContext.objects.filter(conversation_id=conversation_id)[:1],
    conversation_id=uuid.uuid4(),
)
_DEFAULT_PROFILE = FixedQuery(
    # No ordering but the pk (what first() adds): the partial unique constraint allows one default, and
    # Meta.ordering would join the tenant.
    lambda tenant_id: AgentProfile.objects.filter(tenant_id=tenant_id, is_default=True).order_by("pk")[:1],
    tenant_id=uuid.uuid4(),
)


def _context_state(conversation: Conversation) -> ConversationContext:
    state = _CONTEXT_STATE.first(conversation_id=conversation.pk)
    if state is None:
        state, _ = ConversationContext.objects.get_or_create(conversation=conversation)
    return state


def prepare(*, conversation: Conversation, request: ContextRequest) -> ContextState:
    model = request.model or conversation.model
    info = model_info(model)
    fmt = request.format or PROVIDER_FORMAT.get(info.provider, "openai")
    # A stored setting that does not fit its schema is left out (its default applies) and reported below.
    tenant_settings, setting_problems = settings_read(conversation.tenant.settings)
    budget = request.token_budget or default_budget(tenant_settings=tenant_settings, info=info)
    if budget > info.context_window:
        raise ApplicationError(
            f"token_budget {budget} exceeds the {info.context_window}-token window of {model}.",
            code="budget_exceeds_window",
            extra={"context_window": info.context_window},
        )
    state = ContextState(
        conversation=conversation,
        request=request,
        model=model,
        info=info,
        fmt=fmt,
        budget=budget,
        context=_context_state(conversation),
    )
    if not is_known_model(model):
        state.degrade(
            "load", "unknown_model", f"{model!r} is not in the model table; counted as {info.encoding}."
        )
    if setting_problems:
        state.degrade("load", "invalid_tenant_setting", " ".join(setting_problems))
    return state


# --- stages -----------------------------------------------------------------------------------------------


def stage_load(state: ContextState) -> None:
    request = state.request
    if request.user_message_id is not None:
        current = _stored_question(state)
        if current is None:
            raise ApplicationError(
                "user_message_id must name a user message of this conversation.", code="invalid_user_message"
            )
        state.layout.user_message = current.content
        history_until = current.seq - 1
    else:
        state.layout.user_message = request.user_message
        history_until = None
    if sources.retrieval_enabled(state):
        # The vector of what the question is about is computed while the stages below read the database.
        embed_query_ahead(focused(state.layout.user_message))

    profile = _agent_profile(state)
    if profile is not None:
        text = profile.render()
        state.layout.b1 = Item(
            text=text,
            tokens=count_cached(text, model=state.model),
            source={"kind": "agent_profile", "id": str(profile.id), "version": profile.version},
        )
    # Read once: summaries, core memory, B6 and the compaction check all start from it.
    state.boundary_seq = sources.boundary_seq(state.conversation)
    sources.load_summaries(state)
    sources.load_core_memory(state)
    state.history_until = history_until
    _load_history(state, until_seq=history_until)


def _stored_question(state: ContextState) -> Message | None:
    """The user message the request names, of this conversation: the row the caller holds when it just
    stored it (the chat proxy), else read."""
    request, held = state.request, state.request.user_message_row
    if request.user_message_id is None:
        return None
    if (
        held is not None
        and held.pk == request.user_message_id
        and held.conversation_id == state.conversation.pk
        and held.role == Message.Role.USER
    ):
        return held
    return Message.objects.filter(
        conversation=state.conversation, pk=request.user_message_id, role=Message.Role.USER
    ).first()


def _agent_profile(state: ContextState) -> AgentProfile | None:
    tenant = state.conversation.tenant
    if state.request.agent_profile_id is not None:
        profile = (
            AgentProfile.objects.filter(tenant=tenant, pk=state.request.agent_profile_id).order_by().first()
        )
        if profile is None:
            raise ApplicationError("No such agent profile in your tenant.", code="invalid_agent_profile")
        return profile
    if state.context.agent_profile_id is not None:
        return state.context.agent_profile
    default: AgentProfile | None = _DEFAULT_PROFILE.first(tenant_id=tenant.pk)
    return default


def _system_fixed(state: ContextState) -> int:
    """Tokens of B1 and core memory as the system message carries them."""
    b1_b2a = [s for s in render_system_sections(state.layout)[:2] if s]
    return system_message_tokens("\n\n".join(b1_b2a), model=state.model)


def _room(state: ContextState) -> int:
    """What the fixed costs leave: the budget less B1, core memory, the current message with its memory
    updates, and the per-message overheads."""
    layout = state.layout
    fixed = _system_fixed(state)
    fixed += (
        count_cached(layout.user_message, model=state.model) + MESSAGE_OVERHEAD_TOKENS + REPLY_PRIMING_TOKENS
    )
    fixed += sum(i.tokens for i in layout.memory_updates)
    return max(0, state.budget - fixed)


def summary_cap(state: ContextState) -> int:
    """The most B4 may take: SUMMARY_SHARE of what B1 and core memory leave of the budget. Not of the room
    the question leaves: a longer question must not drop the summaries, and the cached prefix with them."""
    return int(max(0, state.budget - _system_fixed(state)) * SUMMARY_SHARE)


def history_allowance(state: ContextState) -> int:
    """B6's share of the room: what retrieval's reserved share, the (capped) summaries and the task state
    leave. It does not depend on the question, so the history the prompt shows (and its cached prefix) does
    not change from one question to the next."""
    room = _room(state)
    layout = state.layout
    summaries = min(sum(i.tokens for i in layout.b4), summary_cap(state))
    per_request = sum(i.tokens for i in (layout.b3, layout.b2b) if i is not None)
    # Retrieval's reserve is its share of the room, but never more than it may take (retrieval_cap).
    reserve = min(int(room * RETRIEVAL_SHARE), retrieval_cap(state.budget))
    return max(0, room - reserve - summaries - per_request)


def _load_history(state: ContextState, *, until_seq: int | None) -> None:
    """B6: messages after the boundary (and after the window start), read newest first and only as far back
    as the budget could possibly use, so a 100k-message conversation costs what its window costs."""
    start = max(state.boundary_seq, state.context.window_start_seq)
    state.history_start = start
    state.history_unread_to = None
    allowance = state.history_allowance = history_allowance(state)
    rows = _history_rows(state, start, NO_END if until_seq is None else until_seq + 1, allowance)
    if not rows:
        return
    user_seqs = [row[1] for row in rows if row[2] == Message.Role.USER]
    state.protected_from_seq = (
        user_seqs[-PROTECTED_EXCHANGES] if len(user_seqs) >= PROTECTED_EXCHANGES else rows[0][1]
    )
    state.layout.b6 = _history_messages(state, rows)
    attach_images(state)  # image bytes, read only for the images the prompt shows as pixels


def _history_messages(state: ContextState, rows: list[tuple[Any, ...]]) -> list[HistoryMessage]:
    """B6's messages as the prompt shows them (context.lines): speaker names, date lines where the day
    changes, relative dates resolved. A turn's tokens grow by what that adds. The history of today alone
    needs no date line (the first turn of an older day, or of a history spanning days, gets one)."""
    messages, day = [], timezone.now().date()
    for pk, seq, role, content, parts, tokens, is_error, completed, name, created_at in rows:
        new_day = created_at.date() != day
        text = turn_text(content, role=role, name=name, created_at=created_at, new_day=new_day)
        if role in SPOKEN_ROLES and content:
            day = created_at.date()
        # The stored count holds the name already (counted as the provider counts a message's name): only
        # the date line and the resolved dates are new tokens.
        unnamed = turn_text(content, role=role, name="", created_at=created_at, new_day=new_day)
        if unnamed != content:
            tokens += count_cached(unnamed, model=state.model) - count_cached(content, model=state.model)
        messages.append(HistoryMessage(str(pk), seq, role, text, _parts(parts), tokens, is_error, completed))
    return messages


# A B6 row as _history_rows reads it (tuples, not model instances: at a 128k window these are thousands).
# The parts come as text: most messages have none ("[]"), and the JSON field's converter decoded each
# one (~1 ms of the ~500-message window of bench/proxy.py).
HISTORY_COLUMNS = (
    "id", "seq", "role", "content", "parts_text", "token_count", "is_error", "completed", "name", "created_at"
)  # fmt: skip
HISTORY_TEXT = {"parts_text": Cast("parts", TextField())}


def _parts(text: str | None) -> list[dict[str, Any]]:
    if not text or text == "[]":  # the column is never null; most messages have no parts
        return []
    parts: list[dict[str, Any]] = json.loads(text)
    return parts


# The end of a history that does not stop before a stored question (within the column's range).
NO_END = 2**62


@functools.lru_cache(maxsize=32)
def _history_page(page_size: int) -> FixedQuery:
    """B6 rows after `after` and before `before`, newest first (the page size is part of the SQL)."""
    return FixedQuery(
        lambda conversation_id, after, before: (
            Message.objects.filter(
                conversation_id=conversation_id, seq__gt=after, seq__lt=before, kind=Message.Kind.MESSAGE
            )
            .annotate(**HISTORY_TEXT)
            .order_by("-seq")
            .values_list(*HISTORY_COLUMNS)[:page_size]
        ),
        conversation_id=uuid.uuid4(),
        after=7_123_456_789_001,
        before=7_123_456_789_003,
    )


def _history_rows(state: ContextState, after: int, before: int, allowance: int) -> list[tuple[Any, ...]]:
    """The rows of B6 (seq after `after` and before `before`), oldest first: pages newest first until they
    hold more than the allowance. Each page reads whole rows: every row a page brings is shown or cut by the
    budget stage, and reading their tokens first and their content in a second query (as before) cost a
    round trip and a query's compilation on every call for the same rows."""
    # Sized so that one page usually covers the allowance (at ~40 tokens a message): a 128k window is
    # thousands of messages, and each page is a query.
    page_size = min(5000, max(500, allowance // 40))
    query = _history_page(page_size)
    rows: list[tuple[Any, ...]] = []
    total = 0
    cursor = before
    while True:
        page = query.run(conversation_id=state.conversation.pk, after=after, before=cursor)
        rows += page
        total += sum(row[5] for row in page)
        if len(page) < page_size:
            break
        if total > allowance:
            # Anything older than what was read cannot fit; the budget stage reports it as dropped.
            state.history_unread_to = page[-1][1] - 1
            break
        cursor = page[-1][1]
    rows.reverse()
    return rows


def stage_overlay(state: ContextState) -> None:
    """B3 and B2b: the conversation's task state, its base with the newer events applied in order."""
    sources.load_task_state(state)


def stage_rewrite(state: ContextState) -> None:
    """Resolve references back in the user message, for retrieval only; the user's text is never replaced."""
    sources.rewrite_query(state)


def stage_retrieve(state: ContextState) -> None:
    """Retrieval candidates for B5 (archival memories, the whole history, other conversations), best first;
    the budget stage places them (as many as the most B5 may take could use)."""
    load_retrieval(state, room=retrieval_cap(state.budget))


def stage_decay(state: ContextState) -> None:
    """Attachments by priority (P0 this turn … P3 other conversations) under the budget (context/decay.py)."""
    attachments_decay(state)


def _exact_total(state: ContextState, history_tokens: int) -> dict[str, int]:
    layout = state.layout
    from prefix_cache.rendering import current_user_text, system_text

    system_tokens = system_message_tokens(system_text(layout), model=state.model)
    user_tokens = count_message(role="user", content=current_user_text(layout), model=state.model)
    return {
        "system": system_tokens,
        "history": history_tokens,
        "user": user_tokens,
        "total": system_tokens + history_tokens + user_tokens + REPLY_PRIMING_TOKENS,
    }


def stage_budget(state: ContextState) -> None:
    """Fit under the budget by value (DESIGN.md, Budget): the summaries keep at most their share, the history
    its allowance (the window moves in one step; the newest exchange is shortened, not dropped, when even it
    does not fit), and retrieval fills the rest with its best hits. Only when that is not enough do B4, B2b
    and B3 give way further. No compaction runs here: one is queued when the history outgrows its share, and
    this request uses what exists. Every drop is listed."""
    layout = state.layout
    cap = summary_cap(state)
    _cap_summaries(state, cap)
    history_tokens = _fit_history(state)
    sources.compaction_schedule(
        state,
        history_budget=max(MIN_COMPACTION_HISTORY_TOKENS, state.history_allowance),
        summary_budget=max(MIN_SUMMARY_BUDGET, int(cap * SUMMARY_FILL)),
    )
    totals = _fill_retrieval(state, history_tokens)
    while totals["total"] > state.budget and layout.b4:
        _drop(state, "B4", layout.b4.pop(0))
        totals = _exact_total(state, history_tokens)
    if totals["total"] > state.budget and layout.b2b:
        item, layout.b2b = layout.b2b, None
        _drop(state, "B2b", item)
        totals = _exact_total(state, history_tokens)
    if totals["total"] > state.budget and layout.b3:
        _truncate_task_state(state, history_tokens=history_tokens)
        totals = _exact_total(state, history_tokens)
    if totals["total"] > state.budget:
        state.degrade(
            "budget",
            "over_budget",
            f"The agent profile, core memory and the current message alone need {totals['total']} tokens; "
            f"the budget is {state.budget}.",
        )
    # Retrieved messages in the order they were said, after the memories.
    layout.b5.sort(key=lambda i: (i.source.get("kind") != "archival", i.source.get("seq", 0)))
    state.tokens = totals


def _drop(state: ContextState, block: str, item: Item, reason: str = "budget") -> None:
    state.dropped.append({"block": block, "reason": reason, "source": item.source, "tokens": item.tokens})


def _cap_summaries(state: ContextState, cap: int) -> None:
    """The oldest segments give way while B4 is over its share (a background roll-up makes them fit again)."""
    layout = state.layout
    while layout.b4 and sum(i.tokens for i in layout.b4) > cap:
        _drop(state, "B4", layout.b4.pop(0))


def _fit_history(state: ContextState) -> int:
    """B6 within its allowance; returns its tokens. Cut in one step from the oldest end (the window start
    moves past the cut and stays there, see WINDOW_REFILL), never into the newest exchange, which is
    shortened instead when it alone is over."""
    layout = state.layout
    allowance = state.history_allowance
    history_tokens = sum(m.token_count for m in layout.b6)
    if history_tokens <= allowance:
        if state.history_unread_to is not None:
            _cut_history(state, [], kept_tokens=history_tokens)
        return history_tokens
    target = int(allowance * WINDOW_REFILL)
    keep_from, kept = len(layout.b6), 0
    for index in range(len(layout.b6) - 1, -1, -1):
        message = layout.b6[index]
        if message.seq >= state.protected_from_seq or kept + message.token_count <= target:
            kept += message.token_count
            keep_from = index
        else:
            break
    # The window starts on a user message: never with a tool result whose call was cut (providers refuse
    # that) or with an answer whose question was cut.
    while (
        keep_from < len(layout.b6)
        and layout.b6[keep_from].role != Message.Role.USER
        and layout.b6[keep_from].seq < state.protected_from_seq
    ):
        kept -= layout.b6[keep_from].token_count
        keep_from += 1
    _cut_history(state, layout.b6[:keep_from], kept_tokens=kept)
    layout.b6 = layout.b6[keep_from:]
    if kept > allowance:
        kept = _shorten_newest(state, allowance)
    return kept


def _shorten_newest(state: ContextState, allowance: int) -> int:
    """The newest exchange alone is over the allowance (a long reply, a pasted file): each text message
    longer than an even share keeps its head, marked as cut (the whole message stays retrievable, and its
    part that matches the question can come back through B5)."""
    layout = state.layout
    share = max(MIN_CUT_TOKENS, allowance // max(1, len(layout.b6)))
    shortened = []
    for message in layout.b6:
        text_only = all(p.get("type") == "text" for p in message.parts)
        if message.token_count <= share or not text_only:
            shortened.append(message)
            continue
        head = truncate_text(message.content, share - MESSAGE_OVERHEAD_TOKENS - 16, model=state.model)
        cut = message.token_count - share
        content = f"{head}\n[… message #{message.seq} shortened here: about {cut} more tokens]"
        tokens = count_message(role=message.role, content=content, model=state.model)
        shortened.append(dataclasses.replace(message, content=content, parts=[], token_count=tokens))
        state.dropped.append(
            {"block": "B6", "reason": "shortened", "seq": message.seq, "id": message.id, "tokens": cut}
        )
    layout.b6 = shortened
    return sum(m.token_count for m in shortened)


def retrieval_cap(budget: int) -> int:
    """The most B5 may take. It sits in the current message, which the provider's prefix cache never serves:
    at small budgets, where the history cannot fit anyway, the evidence is worth all the room left (up to
    RETRIEVAL_FILL_TOKENS); at large ones the cached history carries the prompt, and B5 is held to
    RETRIEVAL_LARGE_TOKENS so the prompt stays mostly cacheable. Linear in between."""
    low, high = RETRIEVAL_FILL_BUDGET, RETRIEVAL_LARGE_BUDGET
    if budget <= low:
        return RETRIEVAL_FILL_TOKENS
    if budget >= high:
        return RETRIEVAL_LARGE_TOKENS
    step = (budget - low) / (high - low)
    return int(RETRIEVAL_FILL_TOKENS + step * (RETRIEVAL_LARGE_TOKENS - RETRIEVAL_FILL_TOKENS))


@dataclasses.dataclass
class _Placed:
    added: list[Item]  # what B5 took, in order
    said: set[str]  # the ids of the messages the prompt shows whole
    repeats: list[Item]  # message hits that fitted but said mostly what B5 already quotes


def _fill_retrieval(state: ContextState, history_tokens: int) -> dict[str, int]:
    """B5: the candidates, best first, into the room the other blocks leave (nothing the prompt already
    shows, see _place_retrieval). Sizes are summed (an item and its separator), then the exact count takes
    back the weakest while it is over. What did not fit, and what only repeated, is listed."""
    layout = state.layout
    totals = _exact_total(state, history_tokens)
    room = min(state.budget - totals["total"], retrieval_cap(state.budget))
    dropped = {d.get("id") for d in state.dropped}  # a set: B6 is hundreds of messages at large budgets
    shown = {m.id for m in layout.b6 if m.id not in dropped}
    placed = _place_retrieval(state, shown, room)
    totals = _exact_total(state, history_tokens)
    while placed.added and totals["total"] > state.budget:
        weakest = min(placed.added, key=lambda i: i.score)
        placed.added.remove(weakest)
        layout.b5.remove(weakest)
        totals = _exact_total(state, history_tokens)
    _list_dropped_hits(state, shown, placed)
    return totals


def _list_dropped_hits(state: ContextState, shown: set[str], placed: _Placed) -> None:
    """One `dropped` entry for the hits that repeated what B5 quotes, one for those that did not fit."""
    in_b5 = {id(i) for i in state.layout.b5}
    repeated = {id(i) for i in placed.repeats}
    left = [
        i
        for i in state.candidates
        if id(i) not in in_b5
        and id(i) not in repeated
        and i.source.get("id") not in shown
        and not _quotes_only(i, placed.said)
    ]
    for reason, items in (("repeats", placed.repeats), ("budget", left)):
        if items:
            state.dropped.append(
                {
                    "block": "B5",
                    "reason": reason,
                    "items": len(items),
                    "tokens": sum(i.tokens for i in items),
                    "best_score": max(i.score for i in items),
                }
            )


def _quotes_only(item: Item, said: set[str]) -> bool:
    """A memory taken from messages the prompt shows whole (the memory agent's rules keep a statement
    verbatim): it says nothing they do not, and without their date and seq."""
    sources = item.source.get("source_message_ids") or []
    return item.source.get("kind") == "archival" and bool(sources) and set(sources) <= said


def _place_retrieval(state: ContextState, shown: set[str], room: int) -> _Placed:
    """Place the candidates in order while they fit: a message B6 shows whole is skipped, and so is a message
    hit repeating what B5 quotes (REPEAT_SHARE) and a memory quoting only messages the prompt shows whole
    (one placed before the message it quotes gives its room back)."""
    layout = state.layout
    placed = _Placed(added=[], said=set(shown), repeats=[])
    quoting: list[Item] = []  # the placed memories that quote messages (only they can become redundant)
    quoted: set[tuple[str, str, str]] = set()  # the word trigrams of the message hits placed
    for item in state.candidates:
        kind = item.source.get("kind")
        ids = item.source.get("ids") or [item.source.get("id")]
        if (kind == "message" and all(i in shown for i in ids)) or _quotes_only(item, placed.said):
            continue
        cost = item.tokens + (SECTION_TOKENS if not layout.b5 else SEPARATOR_TOKENS)
        if cost > room:
            continue
        trigrams = quoted_trigrams(item) if kind == "message" else set()
        if repeats(trigrams, quoted):
            placed.repeats.append(item)
            continue
        quoted |= trigrams
        layout.b5.append(item)
        placed.added.append(item)
        room -= cost
        if kind == "archival" and item.source.get("source_message_ids"):
            quoting.append(item)
        elif kind == "message" and "span" not in item.source:
            placed.said.update(str(i) for i in ids)
            for memory in [i for i in quoting if _quotes_only(i, placed.said)]:
                quoting.remove(memory)
                placed.added.remove(memory)
                layout.b5.remove(memory)
                room += memory.tokens + SEPARATOR_TOKENS
    return placed


def _cut_history(state: ContextState, cut: list[HistoryMessage], *, kept_tokens: int) -> int:
    """List what the cut leaves out (with the older history that was never read) as one B6 drop, move the
    window start past it, and return the tokens the history keeps."""
    messages, tokens = len(cut), sum(m.token_count for m in cut)
    from_seq = cut[0].seq if cut else None
    if state.history_unread_to is not None:
        unread = Message.objects.filter(
            conversation=state.conversation,
            kind=Message.Kind.MESSAGE,
            seq__gt=state.history_start,
            seq__lte=state.history_unread_to,
        ).aggregate(n=Count("id"), tokens=Sum("token_count"), first=Min("seq"))
        if unread["n"]:
            messages += unread["n"]
            tokens += unread["tokens"] or 0
            from_seq = unread["first"]
    if from_seq is None:
        return kept_tokens
    new_start = cut[-1].seq if cut else state.history_unread_to
    assert new_start is not None  # from_seq is set by a cut or by unread messages up to history_unread_to
    state.dropped.append(
        {
            "block": "B6",
            "reason": "budget",
            "from_seq": from_seq,
            "to_seq": new_start,
            "messages": messages,
            "tokens": tokens,
        }
    )
    if state.request.record:
        ConversationContext.objects.filter(pk=state.context.pk, window_start_seq__lt=new_start).update(
            window_start_seq=new_start, updated_at=timezone.now()
        )
    state.context.window_start_seq = new_start
    return kept_tokens


_TRUNCATION_MARKER = "\n[… task state truncated to fit the token budget]"


def _truncate_task_state(state: ContextState, *, history_tokens: int) -> None:
    """Keep the longest head of B3 (plus the marker) that fits; tokens per character vary along a text, so
    the cut is found by bisection rather than estimated once."""
    item = state.layout.b3
    assert item is not None

    def shortened(length: int) -> Item:
        text = item.text[:length] + _TRUNCATION_MARKER
        return Item(text=text, tokens=count_cached(text, model=state.model), source=item.source)

    low, high = 0, len(item.text)
    while low < high:
        middle = (low + high + 1) // 2
        state.layout.b3 = shortened(middle)
        if _exact_total(state, history_tokens)["total"] <= state.budget:
            low = middle
        else:
            high = middle - 1
    state.layout.b3 = shortened(low)
    state.dropped.append(
        {
            "block": "B3",
            "reason": "budget",
            "source": item.source,
            "tokens": item.tokens - state.layout.b3.tokens,
            "truncated": True,
        }
    )


def stage_render(state: ContextState) -> None:
    state.rendered = render(state.layout, state.fmt)


def _prefix_levels(state: ContextState) -> tuple[list[PrefixLevel], list[str], PrefixLevel | None]:
    """(the whole levels B1 … B1+B2a+B4+B6, the history hash chain, the whole prompt's level).

    The chain has one hash per stored history message, each over the one before and the system message,
    so a prompt that extends an earlier one (history grew, nothing before changed) finds the exact message
    up to which the earlier prompt was the same."""
    assert state.rendered is not None
    sections = render_system_sections(state.layout)
    salt = f"{state.fmt}\x00{state.model}\x00"
    levels = []
    for depth, level in enumerate(LEVELS[:3], start=1):
        text = "\n\n".join(s for s in sections[:depth] if s)
        tokens = system_message_tokens(text, model=state.model)
        levels.append(PrefixLevel(level, sha256(salt + text), tokens))
    chain: list[str] = []
    running = levels[-1].hash
    groups = [canonical_json(group) for group in state.rendered.history_groups]
    for group in groups:
        running = sha256(running + group)
        chain.append(running)
    # The whole history's JSON is its groups' entries in one list: the payload hashes it without a second
    # serialisation (thousands of messages at a 128k window).
    state.history_json = "[" + ",".join(group[1:-1] for group in groups if len(group) > 2) + "]"
    history_hash = chain[-1] if chain else sha256(levels[-1].hash + "[]")
    levels.append(PrefixLevel(LEVELS[3], history_hash, levels[-1].tokens + state.tokens["history"]))
    prompt = None
    if state.rendered.current is not None:
        # Recorded so that the next request, whose history ends with this question, matches through it.
        prompt = PrefixLevel(
            "prompt",
            sha256(history_hash + canonical_json([state.rendered.current])),
            levels[-1].tokens + state.tokens["user"],
        )
    return levels, chain, prompt


def stage_hint(state: ContextState) -> None:
    levels, chain, prompt = _prefix_levels(state)
    match = PrefixMatch(level=None, chain_index=None)
    if state.request.record:
        match = prefix_hints_record(
            tenant=state.conversation.tenant, levels=levels + ([prompt] if prompt else []), chain=chain
        )
    hit = match.level if match.level != "prompt" else LEVELS[3]
    if match.chain_index is not None:
        # The system message and the history up to that message were sent before, byte for byte.
        cached_messages = match.chain_index + 1
        hit_tokens = levels[2].tokens + sum(m.token_count for m in state.layout.b6[:cached_messages])
    else:
        cached_messages = 0
        hit_tokens = next((lv.tokens for lv in levels if lv.level == hit), 0)
    provider = {"openai": "openai", "anthropic": "anthropic", "gemini": "gemini"}[state.fmt]
    stable = levels[-1].tokens  # what the next request can re-use if nothing before the boundary changes
    predicted = cacheable_tokens(provider, prefix_tokens=hit_tokens, model=state.model)
    state.prefix = {
        "hashes": {lv.level: lv.hash for lv in levels},
        "tokens": {lv.level: lv.tokens for lv in levels},
        "hint_level": hit,
        "cached_history_messages": cached_messages,
        "predicted_cached_tokens": predicted,
        "cacheable_prefix_tokens": {
            p: cacheable_tokens(p, prefix_tokens=stable, model=state.model)
            for p in ("openai", "anthropic", "gemini")
        },
    }
    if state.request.record:
        usage = cache_usage_open(
            conversation=state.conversation,
            provider=provider,
            model=state.model,
            predicted_prompt_tokens=state.tokens["total"],
            predicted_cacheable_tokens=predicted,
            prefix_hash=levels[-1].hash,
            hint_level=hit,
        )
        state.context_id = str(usage.id)


STAGE_FUNCTIONS = {
    "load": stage_load,
    "overlay": stage_overlay,
    "rewrite": stage_rewrite,
    "retrieve": stage_retrieve,
    "decay": stage_decay,
    "budget": stage_budget,
    "render": stage_render,
    "hint": stage_hint,
}


def context_assemble(*, conversation: Conversation, request: ContextRequest) -> ContextState:
    if request.user_message_id is None and sources.retrieval_wanted(request, request.user_message):
        # A question sent as text is known before anything is read: the local model embeds it while prepare
        # and the load stage read the database (a stored question starts in the load stage).
        embed_query_ahead(focused(request.user_message))
    state = prepare(conversation=conversation, request=request)
    with transaction.atomic():
        for name in STAGES:
            started = time.perf_counter()
            STAGE_FUNCTIONS[name](state)
            state.timings[name] = round((time.perf_counter() - started) * 1000, 3)
    # Redis faults this request rode out (cache, broker, lock; providers.faults), work queued on commit too.
    for code, message in service_faults():
        state.degrade("services", code, message)
    from providers.metrics import context_stages_observe

    context_stages_observe(timings=state.timings)
    return state


def _block(
    text: str, *, model: str, items: list[dict[str, Any]], tokens: int | None = None
) -> dict[str, Any]:
    return {
        "tokens": tokens if tokens is not None else count_cached(text, model=model),
        "sha256": sha256(text),
        "items": items,
    }


def context_payload(state: ContextState) -> dict[str, Any]:
    """The response body: the prompt ready to send, and how it was made."""
    from prefix_cache.rendering import system_sections, user_sections

    assert state.rendered is not None
    layout = state.layout
    b1_text, b2a_text, b4_text = system_sections(layout)
    blocks: dict[str, Any] = {}
    if layout.b1:
        blocks["B1"] = _block(b1_text, model=state.model, items=[layout.b1.source])
    if layout.b2a:
        blocks["B2a"] = _block(
            b2a_text, model=state.model, items=[{**i.source, "tokens": i.tokens} for i in layout.b2a]
        )
    if layout.b4:
        blocks["B4"] = _block(
            b4_text, model=state.model, items=[{**i.source, "tokens": i.tokens} for i in layout.b4]
        )
    if layout.b6:
        blocks["B6"] = {
            **_block(
                state.history_json or canonical_json(state.rendered.history),
                model=state.model,
                items=[
                    {"kind": "message", "id": m.id, "seq": m.seq, "tokens": m.token_count} for m in layout.b6
                ],
                tokens=state.tokens["history"],
            ),
            "from_seq": layout.b6[0].seq,
            "to_seq": layout.b6[-1].seq,
        }
    per_request = {
        "B5": layout.b5,
        "B3": [layout.b3] if layout.b3 else [],
        "B2b": [layout.b2b] if layout.b2b else [],
        "memory_updates": layout.memory_updates,
        "attachments": layout.attachments,
    }
    sections = user_sections(layout)
    for key, items in per_request.items():
        if items:
            blocks[key] = _block(
                sections[key], model=state.model, items=[{**i.source, "tokens": i.tokens} for i in items]
            )
    blocks["user"] = {"tokens": state.tokens["user"], "sha256": sha256(state.rendered.user_text), "items": []}
    return {
        "context_id": state.context_id,
        "model": state.model,
        "format": state.fmt,
        "system": state.rendered.system,
        "messages": state.rendered.messages,
        "token_budget": state.budget,
        "tokens": {**state.tokens, "exact": state.info.exact_tokens},
        "blocks": blocks,
        "dropped": state.dropped,
        "prefix": state.prefix,
        "window": {"boundary_seq": state.boundary_seq, "window_start_seq": state.context.window_start_seq},
        "timings": state.timings,
        "degradations": state.degradations,
    }
