"""Where each block comes from. A source is a function that reads one block into the pipeline's state;
a capability that is not built has no source here, and its block is absent from the prompt.

B1 (agent profile) and B6 (history since the last compaction boundary) are loaded by the pipeline itself.
Summaries (B4), core memory (B2a), session profile (B2b) and task state (B3) register their loaders in
BLOCK_SOURCES; retrieval (B5) runs in the pipeline's own rewrite and retrieve stages, after B6 is loaded
(rewrite_query, load_retrieval)."""

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction

from context.models import ConversationContext
from conversations.models import Conversation, Message
from memory.archival import archival_search
from memory.recall import recall_messages
from memory.rewrite import query_rewrite
from memory.selectors import archival_exists, core_memory_at, core_memory_blocks_current, label_order
from memory.services import core_memory_snapshot_get
from memory.state import SESSION_PROFILE_KEY, state_overlay
from prefix_cache.accounting import count_cached
from prefix_cache.rendering import Item, canonical_json
from summaries.conf import compaction_config
from summaries.locks import LockBusy
from summaries.selectors import history_start_seq, segment_prompt_text, segment_source, segments_live
from summaries.services import (
    CompactionStale,
    compaction_failure_record,
    compaction_request,
    compaction_run,
    history_tokens,
    segments_replay,
)

logger = logging.getLogger(__name__)

BLOCK_SOURCES: dict[str, Callable[[Any], None]] = {}


def boundary_seq(conversation: Conversation) -> int:
    """The seq B6 resumes after: the last message the last compaction summarised (0 before the first).
    The boundary message itself is appended at the end of the transcript when the compaction is written."""
    return history_start_seq(conversation)


# --- B4: summary segments ---------------------------------------------------------------------------------


def load_summaries(state: Any) -> None:
    """B4: the live summary segments, oldest first, each with its seq range. Append-only between boundaries
    (a new segment only arrives with a compaction), so the system message stays byte-identical meanwhile.
    An imported transcript has its compaction records but no segments yet: they are replayed first."""
    segments = segments_live(conversation=state.conversation) or segments_replay(
        conversation=state.conversation
    )
    items = []
    for segment in segments:
        text = segment_prompt_text(segment)
        items.append(
            Item(text=text, tokens=count_cached(text, model=state.model), source=segment_source(segment))
        )
    state.layout.b4 = items


BLOCK_SOURCES["B4"] = load_summaries


# --- B2a: core memory (and the memory-updates section for edits since the last boundary) ------------------


def load_core_memory(state: Any) -> None:
    """B2a shows the end user's blocks at the versions of the conversation's snapshot (its last compaction
    boundary, or its first context call), so the system message stays byte-identical between boundaries.
    Edits made since reach the model as short "memory updates" in the current user message."""
    conversation = state.conversation
    if conversation.end_user_id is None:
        return
    snapshot = core_memory_snapshot_get(conversation=conversation, boundary_seq=boundary_seq(conversation))
    folded = core_memory_at(end_user_id=conversation.end_user_id, versions=snapshot.versions)
    items = []
    for label in sorted(folded, key=label_order):
        text = f"<{label}>\n{folded[label]}\n</{label}>"
        source = {"kind": "core_memory", "label": label, "version": snapshot.versions[label]}
        items.append(Item(text=text, tokens=count_cached(text, model=state.model), source=source))
    state.layout.b2a = items
    updates = []
    for block in core_memory_blocks_current(end_user_id=conversation.end_user_id):
        if snapshot.versions.get(block.label) == block.version:
            continue
        text = f"- core memory <{block.label}> is now (v{block.version}): {block.value}"
        source = {
            "kind": "memory_update",
            "target": "core_memory",
            "label": block.label,
            "version": block.version,
        }
        updates.append(Item(text=text, tokens=count_cached(text, model=state.model), source=source))
    state.layout.memory_updates = [*state.layout.memory_updates, *updates]


BLOCK_SOURCES["B2a"] = load_core_memory


# --- B3 task state and B2b session profile (the overlay: base + the newer events, in order) ---------------


def load_task_state(state: Any) -> None:
    overlay = state_overlay(conversation=state.conversation)
    state.task_state = overlay.state  # for query rewriting in the B5 source
    task = {k: v for k, v in overlay.state.items() if k != SESSION_PROFILE_KEY}
    profile = overlay.state.get(SESSION_PROFILE_KEY)
    if task:
        text = canonical_json(task)
        source = {"kind": "task_state", "epoch": overlay.epoch, "events": len(overlay.pending)}
        state.layout.b3 = Item(text=text, tokens=count_cached(text, model=state.model), source=source)
    if profile:
        if isinstance(profile, dict):
            text = "\n".join(
                f"{key}: {value if isinstance(value, str) else canonical_json(value)}"
                for key, value in sorted(profile.items())
            )
        else:
            text = canonical_json(profile)
        source = {"kind": "session_profile", "epoch": overlay.epoch}
        state.layout.b2b = Item(text=text, tokens=count_cached(text, model=state.model), source=source)


BLOCK_SOURCES["B3"] = load_task_state


# --- B5: retrieval (archival memories and recall of messages before the boundary) ---------------------------


# Retrieval candidates beyond top_k, held back (ContextState.b5_reserve): they only fill the room a budget
# cut of the history (B6 or B4) leaves, so what the cut removed can come back as the parts that match the
# question. A prompt whose history is whole keeps its top_k, and its uncached tail stays short.
RETRIEVAL_RESERVE = 16
DEFAULT_TOP_K = 8
ARCHIVAL_TOP_K = 5


def retrieval_enabled(state: Any) -> bool:
    options = state.request.retrieval or {}
    return bool(options.get("enabled", True) and state.layout.user_message.strip())


def rewrite_query(state: Any) -> None:
    """The rewrite stage: references back ("it", "that one", "那个") resolved for retrieval only; the prompt
    keeps the user's own words."""
    if not retrieval_enabled(state):
        return
    # B6 is loaded: the newest messages the rules and the LLM read are already at hand.
    talk = (Message.Role.USER, Message.Role.ASSISTANT)
    state.rewrite = query_rewrite(
        conversation=state.conversation,
        query=state.layout.user_message,
        task_state=getattr(state, "task_state", None),
        before_seq=state.history_until,
        recent=[(m.role, m.content) for m in reversed(state.layout.b6) if m.role in talk],
    )
    for degradation in state.rewrite.degradations:
        state.degrade("rewrite", degradation["code"], degradation["message"])


def _recall_before_seq(state: Any) -> int:
    """Recall reads this conversation up to the newest exchanges the budget always keeps: what the boundary
    summarised, what an earlier window cut left out, and B6 itself, whose messages this request's budget may
    still cut (hits in the B6 that is sent are left out by the budget stage)."""
    if state.layout.b6:
        return state.protected_from_seq - 1
    start = state.history_start
    return start if state.history_until is None else min(start, state.history_until)


def load_retrieval(state: Any) -> None:
    """The retrieve stage: hybrid search of the end user's archival memories and recall over this
    conversation's earlier messages and the end user's other conversations (with their seq), each scored with
    RRF so the budget stage can trim the weakest. The best top_k (archival: at most ARCHIVAL_TOP_K) not in B6
    go into B5; up to RETRIEVAL_RESERVE more wait in state.b5_reserve."""
    rewrite = state.rewrite
    if rewrite is None:
        return
    options = state.request.retrieval or {}
    top_k = int(options.get("top_k") or DEFAULT_TOP_K)
    conversation = state.conversation
    # A rules rewrite appends terms of the recent history: they weigh less than the user's own words.
    expansion = " ".join(rewrite.terms) if rewrite.method == "rules" else ""
    query = rewrite.query if rewrite.method != "rules" else state.layout.user_message
    memories: list[Item] = []
    if conversation.end_user_id is not None and archival_exists(end_user_id=conversation.end_user_id):
        outcome = archival_search(
            end_user=conversation.end_user,
            query=query,
            limit=min(top_k, ARCHIVAL_TOP_K) + RETRIEVAL_RESERVE,
            expansion=expansion,
        )
        for degradation in outcome.degradations:
            state.degrade("retrieve", degradation["code"], degradation["message"])
        for hit in outcome.hits:
            memory = hit.memory
            text = f"[memory, {memory.kind}] {memory.content}"
            source = {"kind": "archival", "id": str(memory.id), "score": hit.score, "query": rewrite.method}
            memories.append(
                Item(text=text, tokens=count_cached(text, model=state.model), source=source, score=hit.score)
            )
    # This conversation's earlier messages and the end user's other conversations; each hit as the part of
    # its message that matched.
    recalled = recall_messages(
        conversation=conversation,
        query=query,
        before_seq=_recall_before_seq(state),
        limit=top_k + RETRIEVAL_RESERVE,
        other_conversations=True,
        expansion=expansion,
    )
    in_history = {m.id for m in state.layout.b6}
    messages: list[Item] = []
    for hit in recalled:
        where = f'conversation "{hit.conversation_title}", ' if hit.conversation_id else ""
        text = f"[{where}message #{hit.seq}, {hit.role}] {hit.excerpt}"
        source = {
            "kind": "message",
            "id": hit.id,
            "seq": hit.seq,
            "score": hit.score,
            "query": rewrite.method,
        }
        if hit.conversation_id:
            source["conversation_id"] = hit.conversation_id
        messages.append(
            Item(text=text, tokens=count_cached(text, model=state.model), source=source, score=hit.score)
        )
    fresh = [item for item in messages if item.source["id"] not in in_history]
    chosen = memories[: min(top_k, ARCHIVAL_TOP_K)] + fresh[:top_k]
    state.layout.b5 = [*state.layout.b5, *chosen]
    picked = {id(item) for item in chosen}
    state.b5_reserve = sorted(
        (item for item in memories + messages if id(item) not in picked), key=lambda item: -item.score
    )


def compaction_check(state: Any, totals: dict[str, int]) -> bool:
    """Called by the budget stage before it cuts B6. The history since the last boundary (all of it, also
    what an earlier prompt-only window cut left out) is measured against the tenant's history budget: at its
    background share a background compaction is queued (duplicates collapse); at its trigger share, or when
    the prompt would pass the trigger share of the model's window, the request must compact, synchronously,
    and B4 is reloaded. Below that a prompt over this request's budget is cut by the window (prompt only).
    Returns True when the boundary moved (the caller reloads B6). A request that records nothing (the
    inspector's dry run) never compacts.

    Core-memory edits are folded into B2a at a boundary by a receiver of summaries.signals.boundary_moved
    (context/apps.py)."""
    if not state.request.record:
        return False
    cfg = compaction_config(state.conversation)
    # The loaded history is all of it unless a window cut or the budget left older messages unread.
    loaded_all = (
        state.history_start <= state.boundary_seq
        and state.history_unread_to is None
        and state.history_until is None
    )
    history = totals["history"] if loaded_all else history_tokens(state.conversation)
    over = totals["total"] > state.budget
    window_full = totals["total"] > cfg.trigger * state.info.context_window
    if history < cfg.trigger * cfg.history_budget and not window_full:
        if history >= cfg.background * cfg.history_budget:
            compaction_request(conversation=state.conversation, trigger="auto")
        return False
    try:
        # A savepoint: a failed compaction leaves the request's transaction usable for the window cut.
        with transaction.atomic():
            outcome = compaction_run(conversation=state.conversation, trigger="auto", sync=True)
    except (LockBusy, CompactionStale):
        if over:
            state.degrade(
                "budget",
                "compaction_busy",
                "A background compaction of this conversation is running: the oldest history is left out of "
                "this prompt instead (prompt only; nothing is deleted).",
            )
        return False
    except Exception as exc:
        logger.exception("compaction of %s failed on the request path", state.conversation.id)
        # The savepoint took the failure record with it: record it again, outside.
        compaction_failure_record(conversation=state.conversation, trigger="auto", exc=exc)
        state.degrade(
            "budget",
            "compaction_failed",
            f"Compaction failed ({type(exc).__name__}): the oldest history is left out of this prompt "
            "instead.",
        )
        return False
    if outcome is None:
        return False
    for degradation in outcome.degradations:
        state.degrade("budget", degradation["code"], degradation["message"])
    state.dropped.append(
        {
            "block": "B6",
            "reason": "compacted",
            "from_seq": outcome.start_seq,
            "to_seq": outcome.end_seq,
            "messages": outcome.messages_summarised,
            "tokens": outcome.range_tokens,
            "summary_tokens": sum(s.token_count for s in outcome.segments),
            "segment_ids": [str(s.id) for s in outcome.segments],
            "source": outcome.source,
        }
    )
    # A prompt-only window cut made while compaction could not run must not hide messages the new boundary
    # left in B6.
    ConversationContext.objects.filter(pk=state.context.pk, window_start_seq__gt=outcome.end_seq).update(
        window_start_seq=outcome.end_seq
    )
    state.context.window_start_seq = min(state.context.window_start_seq, outcome.end_seq)
    load_summaries(state)
    return True
