"""One readiness signal per conversation: whether everything that changes what a context call returns is
done (vectors, the memory agent's reading, due compactions). A client that imported a history waits on it and
nothing else. Each app registers the check for its own background work; this app owns the registry, so that
it never imports the apps above it."""

from collections.abc import Callable
from typing import Any

from conversations.embedding import retrieval_index_status
from conversations.models import Conversation

# name -> a check returning whether that work is done for the conversation.
_CHECKS: dict[str, Callable[[Conversation], bool]] = {}


def readiness_check_register(name: str, check: Callable[[Conversation], bool]) -> None:
    _CHECKS[name] = check


def conversation_readiness(conversation: Conversation) -> dict[str, Any]:
    """{"ready": all done, "waiting_for": the names of the work still under way, in registration order}."""
    waiting = [name for name, check in _CHECKS.items() if not check(conversation)]
    return {"ready": not waiting, "waiting_for": waiting}


def _vectors_done(conversation: Conversation) -> bool:
    status = retrieval_index_status(conversation)
    return status["model"] is None or status["embedded"] >= status["messages"]


readiness_check_register("vectors", _vectors_done)
