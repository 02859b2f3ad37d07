"""The context pipeline: load → overlay → rewrite → retrieve → decay → budget → render → hint over one
state object, each stage timed; then the writes the stages noted are applied, once (context/writes.py).

Blocks come from sources (context/sources.py); a block whose source is not built is absent, never faked.
The budget arithmetic lives in context/budget.py, B6 in context/history.py, the placing in
context/placement.py, the prefix hints in context/prefix.py, the response body in context/serializers.py
(its blocks in context/blocks.py).
"""

import time
from collections.abc import Callable

from context import sources
from context.decay import attachments_decay
from context.load import call_reads, prepare, question_and_blocks_load
from context.placement import budget_fit
from context.prefix import prefix_hint
from context.retrieved import load_retrieval
from context.state import ContextRequest, ContextState
from context.writes import writes_apply
from conversations.models import Conversation
from prefix_cache.rendering import render
from providers.embeddings import embed_query_ahead
from providers.faults import service_faults
from providers.metrics import context_stages_observe
from retrieval.questions import focused
from tenants.statements import read_ahead

STAGES = ("load", "overlay", "rewrite", "retrieve", "decay", "budget", "render", "hint")


def stage_overlay(state: ContextState) -> None:
    """B3 and B2b: the conversation's task state, its base with the newer events applied in order."""
    sources.load_task_state(state)


def stage_rewrite(state: ContextState) -> None:
    """Resolve references back in the user message, for retrieval only; the user's text is never replaced."""
    sources.rewrite_query(state)


def stage_retrieve(state: ContextState) -> None:
    """Retrieval candidates for B5 (archival memories, the whole history, other conversations), best first;
    the budget stage places them (as many as the most B5 can take in this call could use)."""
    load_retrieval(state, room=state.shares.retrieval_room)


def stage_render(state: ContextState) -> None:
    state.rendered = render(state.layout, state.fmt)


STAGE_FUNCTIONS: dict[str, Callable[[ContextState], None]] = {
    "load": question_and_blocks_load,  # the question, B1, B4, B2a, the call's Budget, then B6
    "overlay": stage_overlay,
    "rewrite": stage_rewrite,
    "retrieve": stage_retrieve,
    "decay": attachments_decay,  # attachments by priority (P0 this turn … P3 other conversations)
    "budget": budget_fit,  # fit under the budget by value (DESIGN.md, Budget)
    "render": stage_render,
    "hint": prefix_hint,
}


def context_assemble(*, conversation: Conversation, request: ContextRequest) -> ContextState:
    if request.user_message_id is None and sources.retrieval_wanted(request, request.user_message):
        # A question sent as text is known before anything is read: the local model embeds it while prepare
        # and the load stage read the database (a stored question starts in the load stage).
        embed_query_ahead(focused(request.user_message))
    # The stages' small reads in one round trip; the writes after them read afresh.
    with read_ahead(call_reads(conversation, retrieval=sources.retrieval_requested(request))):
        state = prepare(conversation=conversation, request=request)
        for name in STAGES:
            started = time.perf_counter()
            STAGE_FUNCTIONS[name](state)
            state.timings[name] = round((time.perf_counter() - started) * 1000, 3)
    writes_apply(state)
    # Redis faults this request rode out (cache, broker, lock; providers.faults), work queued on commit too.
    for code, message in service_faults():
        state.degrade("services", code, message)
    context_stages_observe(timings=state.timings)
    return state
