"""The context pipeline: load → overlay → rewrite → retrieve → decay → budget → render → hint over one
state object. Each stage records its time and any fallback it took (degradations).

Blocks come from sources (context/sources.py); a block whose source is not built is absent, never faked.
"""

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Min, Sum
from django.utils import timezone

from context import sources
from context.images import attach_images
from context.models import AgentProfile, ConversationContext
from conversations.models import Conversation, Message
from prefix_cache.accounting import count_cached
from prefix_cache.rendering import HistoryMessage, Item, Layout, Rendered, canonical_json, render, sha256
from prefix_cache.rendering import system_sections as render_system_sections
from prefix_cache.services import PrefixLevel, PrefixMatch, cache_usage_open, prefix_hints_record
from prefix_cache.usage import cacheable_tokens
from providers.degradations import degradation_count
from providers.model_table import ModelInfo, is_known_model, model_info
from providers.tokens import MESSAGE_OVERHEAD_TOKENS, REPLY_PRIMING_TOKENS, count_message
from tenants.errors import ApplicationError

logger = logging.getLogger(__name__)

STAGES = ("load", "overlay", "rewrite", "retrieve", "decay", "budget", "render", "hint")
PROVIDER_FORMAT = {"openai": "openai", "anthropic": "anthropic", "google": "gemini"}
LEVELS = ("B1", "B1+B2a", "B1+B2a+B4", "B1+B2a+B4+B6")
# After a forced cut the history keeps this share of its allowance, so it can grow for several turns before
# the window has to move again (and the prompt prefix stays byte-identical meanwhile).
WINDOW_REFILL = 0.6
PROTECTED_EXCHANGES = 2
# Estimates for filling B5 (the exact count checks after): a "\n\n" between items; the section's title and
# the question's own title when B5 was empty.
SEPARATOR_TOKENS = 2
SECTION_TOKENS = 16


@dataclass
class ContextRequest:
    user_message: str
    token_budget: int | None = None
    model: str | None = None
    format: str | None = None
    attachments: list[dict[str, Any]] = field(default_factory=list)
    retrieval: dict[str, Any] = field(default_factory=dict)
    agent_profile_id: uuid.UUID | None = None
    user_message_id: uuid.UUID | None = None
    record: bool = True


@dataclass
class ContextState:
    conversation: Conversation
    request: ContextRequest
    model: str
    info: ModelInfo
    fmt: str
    budget: int
    context: ConversationContext
    layout: Layout = field(default_factory=Layout)
    boundary_seq: int = 0
    history_until: int | None = None  # the history stops here when the question is a stored message
    history_start: int = 0  # the history is read after this seq (the boundary or the window start)
    # Set when older history after history_start was not even read because it could not fit: up to this seq.
    history_unread_to: int | None = None
    protected_from_seq: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    degradations: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    rendered: Rendered | None = None
    tokens: dict[str, Any] = field(default_factory=dict)
    prefix: dict[str, Any] = field(default_factory=dict)
    context_id: str | None = None
    rewrite: Any = None  # the rewrite stage's memory.rewrite.Rewrite (None: no retrieval)
    # Retrieval hits beyond top_k: they fill only the room a budget cut of the history leaves.
    b5_reserve: list[Item] = field(default_factory=list)

    def degrade(self, stage: str, code: str, message: str) -> None:
        """A fallback is never silent: logged, counted and reported in the response."""
        logger.warning("context degradation %s/%s for %s: %s", stage, code, self.conversation.id, message)
        degradation_count(code)
        self.degradations.append({"stage": stage, "code": code, "message": message})


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


def _context_state(conversation: Conversation) -> ConversationContext:
    state, _ = ConversationContext.objects.get_or_create(conversation=conversation)
    return state


def prepare(*, conversation: Conversation, request: ContextRequest) -> ContextState:
    model = request.model or conversation.model
    info = model_info(model)
    fmt = request.format or PROVIDER_FORMAT.get(info.provider, "openai")
    budget = request.token_budget or default_budget(
        tenant_settings=conversation.tenant.settings or {}, info=info
    )
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
    return state


# --- stages -----------------------------------------------------------------------------------------------


def stage_load(state: ContextState) -> None:
    request = state.request
    if request.user_message_id is not None:
        current = Message.objects.filter(
            conversation=state.conversation, pk=request.user_message_id, role=Message.Role.USER
        ).first()
        if current is None:
            raise ApplicationError(
                "user_message_id must name a user message of this conversation.", code="invalid_user_message"
            )
        state.layout.user_message = current.content
        history_until = current.seq - 1
    else:
        state.layout.user_message = request.user_message
        history_until = None

    profile = _agent_profile(state)
    if profile is not None:
        text = profile.render()
        state.layout.b1 = Item(
            text=text,
            tokens=count_cached(text, model=state.model),
            source={"kind": "agent_profile", "id": str(profile.id), "version": profile.version},
        )
    for loader in sources.BLOCK_SOURCES.values():
        loader(state)  # each later capability (summaries, memory, retrieval) plugs in here
    state.boundary_seq = sources.boundary_seq(state.conversation)
    state.history_until = history_until
    _load_history(state, until_seq=history_until)


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
    # No ordering: the partial unique constraint allows one default, and Meta.ordering would join the tenant.
    return AgentProfile.objects.filter(tenant=tenant, is_default=True).order_by().first()


def _history_allowance(state: ContextState) -> int:
    layout = state.layout
    fixed = system_message_tokens(
        "\n\n".join(s for s in render_system_sections(layout) if s), model=state.model
    )
    fixed += (
        count_cached(layout.user_message, model=state.model) + MESSAGE_OVERHEAD_TOKENS + REPLY_PRIMING_TOKENS
    )
    return state.budget - fixed


def _load_history(state: ContextState, *, until_seq: int | None) -> None:
    """B6: messages after the boundary (and after the window start), read newest first and only as far back
    as the budget could possibly use, so a 100k-message conversation costs what its window costs."""
    start = max(state.boundary_seq, state.context.window_start_seq)
    state.history_start = start
    state.history_unread_to = None
    allowance = max(0, _history_allowance(state))
    base = Message.objects.filter(conversation=state.conversation, seq__gt=start, kind=Message.Kind.MESSAGE)
    if until_seq is not None:
        base = base.filter(seq__lte=until_seq)
    page_size = 500
    rows: list[tuple[int, int, str]] = []
    total = 0
    cursor = None
    while True:
        page_qs = base if cursor is None else base.filter(seq__lt=cursor)
        page = list(page_qs.order_by("-seq").values_list("seq", "token_count", "role")[:page_size])
        rows += page
        total += sum(r[1] for r in page)
        if len(page) < page_size:
            break
        if total > allowance:
            # Anything older than what was read cannot fit; the budget stage reports it as dropped.
            state.history_unread_to = page[-1][0] - 1
            break
        cursor = page[-1][0]
    rows.reverse()
    if not rows:
        return
    user_seqs = [seq for seq, _, role in rows if role == Message.Role.USER]
    state.protected_from_seq = (
        user_seqs[-PROTECTED_EXCHANGES] if len(user_seqs) >= PROTECTED_EXCHANGES else rows[0][0]
    )
    # Bounded on both sides and limited: with only a lower bound PostgreSQL estimates the range from the
    # whole table and may pick a parallel bitmap scan over the conversation's index.
    messages = (
        base.filter(seq__gte=rows[0][0], seq__lte=rows[-1][0])
        .order_by("seq")
        .only("id", "seq", "role", "content", "parts", "token_count", "is_error", "completed")[: len(rows)]
    )
    state.layout.b6 = [
        HistoryMessage(
            id=str(m.id),
            seq=m.seq,
            role=m.role,
            content=m.content,
            parts=m.parts,
            token_count=m.token_count,
            is_error=m.is_error,
            completed=m.completed,
        )
        for m in messages
    ]
    attach_images(state)  # image bytes, read only for the images the prompt shows as pixels


def stage_overlay(state: ContextState) -> None:
    """Task-state events newer than the base state (B3) are applied by the memory capability's source."""


def stage_rewrite(state: ContextState) -> None:
    """Resolve references back in the user message, for retrieval only; the user's text is never replaced."""
    sources.rewrite_query(state)


def stage_retrieve(state: ContextState) -> None:
    """Retrieval (B5: archival memories, earlier messages); drop what B6 already holds."""
    sources.load_retrieval(state)
    in_history = {m.id for m in state.layout.b6}
    state.layout.b5 = [item for item in state.layout.b5 if item.source.get("id") not in in_history]


def stage_decay(state: ContextState) -> None:
    """Attachments sent with this request are priority P0: described in full in the current message."""
    for attachment in state.request.attachments:
        lines = [f"- {attachment['name']}"]
        if attachment.get("description"):
            lines.append(f"  {attachment['description']}")
        if attachment.get("content"):
            lines.append(attachment["content"])
        text = "\n".join(lines)
        state.layout.attachments.append(
            Item(
                text=text,
                tokens=count_cached(text, model=state.model),
                source={"kind": "attachment", "name": attachment["name"], "priority": "P0"},
            )
        )


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
    """Fit under the budget. B1 and the newest exchanges are never dropped; otherwise trim lowest-scored B5
    items, then the oldest history beyond the newest two exchanges (in one step, see WINDOW_REFILL), then
    the oldest summary segments, then B2b, then B3 (truncated with a marker). Every drop is listed."""
    layout = state.layout
    history_tokens = sum(m.token_count for m in layout.b6)
    totals = _exact_total(state, history_tokens)

    trimmed_b5 = []
    while totals["total"] > state.budget and layout.b5:
        lowest = min(range(len(layout.b5)), key=lambda i: (layout.b5[i].score, -i))
        item = layout.b5.pop(lowest)
        trimmed_b5.append(item)
        state.dropped.append(
            {"block": "B5", "reason": "budget", "source": item.source, "tokens": item.tokens}
        )
        totals = _exact_total(state, history_tokens)

    if layout.b6 and sources.compaction_check(state, totals):
        # Compaction moved the boundary (B4 gained a segment): B6 now starts after it.
        state.boundary_seq = sources.boundary_seq(state.conversation)
        layout.b6 = []
        _load_history(state, until_seq=state.history_until)
        history_tokens = sum(m.token_count for m in layout.b6)
        totals = _exact_total(state, history_tokens)

    if totals["total"] > state.budget and layout.b6:
        over = totals["total"] - state.budget
        allowance = max(0, history_tokens - over)
        target = int(allowance * WINDOW_REFILL)
        keep_from = len(layout.b6)
        kept = 0
        for index in range(len(layout.b6) - 1, -1, -1):
            message = layout.b6[index]
            if message.seq >= state.protected_from_seq or kept + message.token_count <= target:
                kept += message.token_count
                keep_from = index
            else:
                break
        # The window starts on a user message: never with a tool result whose call was cut (providers
        # refuse that) or with an answer whose question was cut.
        while (
            keep_from < len(layout.b6)
            and layout.b6[keep_from].role != Message.Role.USER
            and layout.b6[keep_from].seq < state.protected_from_seq
        ):
            kept -= layout.b6[keep_from].token_count
            keep_from += 1
        history_tokens = _cut_history(state, layout.b6[:keep_from], kept_tokens=kept)
        layout.b6 = layout.b6[keep_from:]
        totals = _exact_total(state, history_tokens)
    elif state.history_unread_to is not None:
        history_tokens = _cut_history(state, [], kept_tokens=history_tokens)

    while totals["total"] > state.budget and layout.b4:
        item = layout.b4.pop(0)
        state.dropped.append(
            {"block": "B4", "reason": "budget", "source": item.source, "tokens": item.tokens}
        )
        totals = _exact_total(state, history_tokens)

    if totals["total"] > state.budget and layout.b2b:
        item, layout.b2b = layout.b2b, None
        state.dropped.append(
            {"block": "B2b", "reason": "budget", "source": item.source, "tokens": item.tokens}
        )
        totals = _exact_total(state, history_tokens)

    if totals["total"] > state.budget and layout.b3:
        _truncate_task_state(state, history_tokens=history_tokens)
        totals = _exact_total(state, history_tokens)

    totals = _refill_retrieval(state, trimmed_b5, totals, history_tokens)
    if totals["total"] > state.budget:
        state.degrade(
            "budget",
            "over_budget",
            f"The agent profile and the newest exchanges alone need {totals['total']} tokens; "
            f"the budget is {state.budget}.",
        )
    state.tokens = totals


def _refill_retrieval(
    state: ContextState, trimmed: list[Item], totals: dict[str, int], history_tokens: int
) -> dict[str, int]:
    """B5 was trimmed first, while B6 and B4 were still whole; the room their cuts left goes back to the
    trimmed items, best score first, so a cut history does not also cost the retrieval that replaces it.
    When the history is not whole (cut now or by an earlier window), the held-back hits fill what is left,
    best first, the recalled messages the cut removed among them. Sizes are summed (an item and its
    separator), then the exact count takes back the last ones while it is over."""
    layout = state.layout
    candidates = sorted(trimmed, key=lambda i: -i.score)
    history_cut = state.history_start > state.boundary_seq or any(
        d["block"] in ("B6", "B4") and d["reason"] == "budget" for d in state.dropped
    )
    if history_cut:
        in_history = {m.id for m in layout.b6}
        candidates += [i for i in state.b5_reserve if i.source.get("id") not in in_history]
    room = state.budget - totals["total"]
    added: list[Item] = []
    for item in candidates:
        cost = item.tokens + (SECTION_TOKENS if not layout.b5 else SEPARATOR_TOKENS)
        if cost <= room:
            layout.b5.append(item)
            added.append(item)
            room -= cost
    if not added:
        return totals
    candidate = _exact_total(state, history_tokens)
    while added and candidate["total"] > state.budget:
        layout.b5.remove(added.pop())
        candidate = _exact_total(state, history_tokens)
    returned = {id(item.source) for item in added}
    state.dropped = [d for d in state.dropped if not (d["block"] == "B5" and id(d["source"]) in returned)]
    return candidate


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
    for group in state.rendered.history_groups:
        running = sha256(running + canonical_json(group))
        chain.append(running)
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
    state = prepare(conversation=conversation, request=request)
    with transaction.atomic():
        for name in STAGES:
            started = time.perf_counter()
            STAGE_FUNCTIONS[name](state)
            state.timings[name] = round((time.perf_counter() - started) * 1000, 3)
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
                canonical_json(state.rendered.history),
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
