"""The context pipeline's request and the one state object its stages pass along (the pipeline's modules,
context/sources.py and context/retrieved.py all read and write it; none of them imports another for it)."""

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from context.budget import Budget
from context.dropped import Dropped
from context.models import ConversationContext
from conversations.models import Conversation, Message
from prefix_cache.provenance import RetrievedSource
from prefix_cache.rendering import Item, Layout, Rendered
from providers.degradations import Degradation, degradation_count
from providers.model_table import ModelInfo
from retrieval.rewrite import Rewrite

logger = logging.getLogger(__name__)


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
    # The row of user_message_id when the caller holds it (the proxy has just stored it): not read again.
    user_message_row: Message | None = None
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
    # What each block may take in this prompt (context/budget.py), fixed before the history is read.
    shares: Budget = field(default_factory=Budget)
    timings: dict[str, float] = field(default_factory=dict)
    degradations: list[Degradation] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    rendered: Rendered | None = None
    history_json: str = ""  # B6 as sent, canonical JSON (the hint stage serialises it once for both hashes)
    tokens: dict[str, Any] = field(default_factory=dict)
    prefix: dict[str, Any] = field(default_factory=dict)
    context_id: str | None = None
    task_state: dict[str, Any] | None = None  # the overlaid task state, for query rewriting
    rewrite: Rewrite | None = None  # the rewrite stage's outcome (None: no retrieval)
    # Retrieval hits, best first: the budget stage fills B5 from them with the room the other blocks leave.
    candidates: list[Item[RetrievedSource]] = field(default_factory=list)

    # What the call changes (rows, queued work), applied once after the stages by context/writes.py, and only
    # when the request records: a stage never writes itself.
    writes: list[Callable[[], object]] = field(default_factory=list)
    # The call's record (its prefix hints and CacheUsage row): inserts nothing in the call reads back and no
    # other write depends on, applied after `writes` in one round trip (context/writes.py).
    records: list[Callable[[], object]] = field(default_factory=list)

    def degrade(self, stage: str, code: str, message: str) -> None:
        """A fallback is never silent: logged, counted and reported in the response (once per cause)."""
        if any(d.stage == stage and d.code == code for d in self.degradations):
            return
        logger.warning("context degradation %s/%s for %s: %s", stage, code, self.conversation.id, message)
        degradation_count(code)
        self.degradations.append(Degradation(code=code, message=message, stage=stage))
