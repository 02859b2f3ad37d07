"""Where each block comes from. A source is a function that reads one block into the pipeline's state.

B1 (agent profile) and B6 (history since the last compaction boundary) are loaded by the pipeline itself;
its load stage calls load_summaries (B4) and load_core_memory (B2a), its overlay stage load_task_state (B3
and B2b: the base state with the newer events applied), its rewrite and retrieve stages rewrite_query and
load_retrieval (B5), after B6 is loaded."""

import functools
import logging

from django.db import transaction

from context.state import ContextRequest, ContextState
from conversations.models import Conversation, Message
from memory.selectors import core_memory_at, core_memory_blocks_current, label_order
from memory.services import core_memory_snapshot_get, core_memory_snapshot_read
from memory.state import SESSION_PROFILE_KEY, state_overlay
from prefix_cache.accounting import count_cached
from prefix_cache.provenance import (
    CoreMemorySource,
    MemoryUpdateSource,
    SessionProfileSource,
    SummarySegmentSource,
    TaskStateSource,
)
from prefix_cache.rendering import Item, canonical_json
from retrieval.rewrite import query_rewrite
from summaries.conf import compaction_config
from summaries.selectors import history_start_seq, segment_prompt_text, segments_live
from summaries.services import compaction_queued, compaction_request, history_tokens

logger = logging.getLogger(__name__)


def boundary_seq(conversation: Conversation) -> int:
    """The seq B6 resumes after: the last message the last compaction summarised (0 before the first).
    The boundary message itself is appended at the end of the transcript when the compaction is written."""
    return history_start_seq(conversation)


# --- B4: summary segments ---------------------------------------------------------------------------------


def load_summaries(state: ContextState) -> None:
    """B4: the live summary segments, oldest first, each with its seq range. Append-only between boundaries
    (a new segment only arrives with a compaction), so the system message stays byte-identical meanwhile.
    An imported transcript's segments are replayed when it is imported (summaries.receivers)."""
    segments = segments_live(conversation=state.conversation)
    items = []
    for segment in segments:
        text = segment_prompt_text(segment)
        source = SummarySegmentSource(
            id=str(segment.id),
            start_seq=segment.start_seq,
            end_seq=segment.end_seq,
            level=segment.level,
            source=segment.source,
        )
        items.append(Item(text=text, tokens=count_cached(text, model=state.model), source=source))
    state.layout.summaries = items


# --- B2a: core memory (and the memory-updates section for edits since the last boundary) ------------------


def load_core_memory(state: ContextState) -> None:
    """B2a shows the end user's blocks at the versions of the conversation's snapshot (its last compaction
    boundary, or its first context call), so the system message stays byte-identical between boundaries.
    Edits made since reach the model as short "memory updates" in the current user message."""
    conversation = state.conversation
    if conversation.end_user_id is None:
        return
    snapshot, unsaved = core_memory_snapshot_read(conversation=conversation, boundary_seq=state.boundary_seq)
    if unsaved:  # taken at the first call, advanced past a boundary that moved
        state.writes.append(
            functools.partial(
                core_memory_snapshot_get, conversation=conversation, boundary_seq=state.boundary_seq
            )
        )
    current = core_memory_blocks_current(end_user_id=conversation.end_user_id)
    folded = core_memory_at(end_user_id=conversation.end_user_id, versions=snapshot.versions, current=current)
    items = []
    for label in sorted(folded, key=label_order):
        text = f"<{label}>\n{folded[label]}\n</{label}>"
        block_source = CoreMemorySource(label=label, version=snapshot.versions[label])
        items.append(Item(text=text, tokens=count_cached(text, model=state.model), source=block_source))
    state.layout.core_memory = items
    updates = []
    for block in current:
        if snapshot.versions.get(block.label) == block.version:
            continue
        text = f"- core memory <{block.label}> is now (v{block.version}): {block.value}"
        update = MemoryUpdateSource(label=block.label, version=block.version)
        updates.append(Item(text=text, tokens=count_cached(text, model=state.model), source=update))
    state.layout.memory_updates = [*state.layout.memory_updates, *updates]


# --- B3 task state and B2b session profile (the overlay: base + the newer events, in order) ---------------


def load_task_state(state: ContextState) -> None:
    """B3 (task state) and B2b (the session profile, its "session_profile" key): the base state with the
    events newer than it applied in order."""
    overlay = state_overlay(conversation=state.conversation)
    state.task_state = overlay.state  # for query rewriting in the B5 source
    task = {k: v for k, v in overlay.state.items() if k != SESSION_PROFILE_KEY}
    profile = overlay.state.get(SESSION_PROFILE_KEY)
    if task:
        text = canonical_json(task)
        task_source = TaskStateSource(epoch=overlay.epoch, events=len(overlay.pending))
        state.layout.task_state = Item(
            text=text, tokens=count_cached(text, model=state.model), source=task_source
        )
    if profile:
        if isinstance(profile, dict):
            text = "\n".join(
                f"{key}: {value if isinstance(value, str) else canonical_json(value)}"
                for key, value in sorted(profile.items())
            )
        else:
            text = canonical_json(profile)
        profile_source = SessionProfileSource(epoch=overlay.epoch)
        state.layout.session_profile = Item(
            text=text, tokens=count_cached(text, model=state.model), source=profile_source
        )


# --- B5: retrieval (archival memories and recall of messages before the boundary) ---------------------------


def retrieval_enabled(state: ContextState) -> bool:
    return retrieval_wanted(state.request, state.layout.user_message)


def retrieval_requested(request: ContextRequest) -> bool:
    """Whether the request leaves retrieval on (it is, unless it says otherwise)."""
    return bool((request.retrieval or {}).get("enabled", True))


def retrieval_wanted(request: ContextRequest, question: str) -> bool:
    """Whether the request's question (its text, or the stored message it names) is searched for."""
    return retrieval_requested(request) and bool(question.strip())


def rewrite_query(state: ContextState) -> None:
    """The rewrite stage: references back ("it", "that one", "那个") resolved for retrieval only; the prompt
    keeps the user's own words."""
    if not retrieval_enabled(state):
        return
    # B6 is loaded: the newest messages the rules and the LLM read are already at hand.
    talk = (Message.Role.USER, Message.Role.ASSISTANT)
    state.rewrite = query_rewrite(
        conversation=state.conversation,
        query=state.layout.user_message,
        task_state=state.task_state,
        before_seq=state.history_until,
        recent=[(m.role, m.content) for m in reversed(state.layout.history) if m.role in talk],
    )
    for degradation in state.rewrite.degradations:
        state.degrade("rewrite", degradation["code"], degradation["message"])


def compaction_schedule(state: ContextState, *, history_budget: int, summary_budget: int) -> None:
    """Called by the budget stage: when the history since the last boundary passes the background share of
    `history_budget` (sized from this request's budget), a background compaction is queued (duplicates
    collapse) with that budget, and `summary_budget` (B4's share) for its roll-ups. The request itself
    never compacts: it uses the summaries that exist and cuts the window (prompt only) meanwhile. The queueing
    is one of the call's writes (a request that records nothing, the inspector's dry run, queues nothing).

    Core-memory edits are folded into B2a at a boundary by a receiver of summaries.signals.boundary_moved
    (context/apps.py)."""
    cfg = compaction_config(state.conversation)
    budget = min(history_budget, cfg.history_budget)
    loaded_all = (
        state.history_start <= state.boundary_seq
        and state.history_unread_to is None
        and state.history_until is None
        and not any(d.block == "B6" for d in state.dropped)
    )
    if loaded_all:
        history = sum(m.token_count for m in state.layout.history)
    elif compaction_queued(state.conversation):
        return  # one is on its way: summing the history (thousands of rows when it lags) would only say so
    else:
        history = history_tokens(state.conversation, cut=state.boundary_seq)
    if history >= cfg.background * budget:
        # Once the call has committed, not inside it: compaction_request locks the compaction-state row, and a
        # call holding it until its commit (which checks its new rows' keys against the conversation row a
        # running compaction holds, while that compaction waits for the state row) deadlocked on PostgreSQL.
        conversation = state.conversation

        def queue() -> None:
            compaction_request(
                conversation=conversation,
                trigger="auto",
                history_budget=budget,
                summary_budget=summary_budget,
            )

        state.writes.append(functools.partial(transaction.on_commit, queue))
