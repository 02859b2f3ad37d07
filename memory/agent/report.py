"""What one run of the memory agent reports (AgentRun): how far it read, the operations, refused tool calls,
notes and degradations; and how a degradation is recorded, never silently."""

import logging
from dataclasses import dataclass, field
from typing import Any

from conversations.models import Conversation
from providers.degradations import degradation_count

logger = logging.getLogger(__name__)


@dataclass
class AgentRun:
    """What a run did; also the run's own record while it goes (the tool loop adds to it)."""

    processed_to: int = 0
    operations: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "rules"  # rules (no LLM) | llm | rules_fallback (an LLM is configured but did not serve)
    notes: list[str] = field(default_factory=list)
    # Tool calls that were refused (unknown tool or label, bad arguments, over the limit, stale version).
    errors: list[dict[str, Any]] = field(default_factory=list)
    degradations: list[dict[str, str]] = field(default_factory=list)
    model: str = ""
    rounds: int = 0
    llm_tokens: int = 0


def degrade(run: AgentRun, code: str, message: str, *, conversation: Conversation) -> None:
    """A fallback is never silent: logged, counted (the same counters as the context pipeline's) and kept
    in the run."""
    logger.warning("memory agent degradation %s for %s: %s", code, conversation.id, message)
    degradation_count(code)
    run.degradations.append({"code": code, "message": message})
    run.notes.append(message)
