"""Two lanes in one server process: the calls an agent waits on before its next model call (the foreground:
the context call, the chat proxy's preparation) and everything else (the background: appends, imports,
uploads, memory edits, reads for the admin).

The request threads of a process share one interpreter lock and the machine's cores. While a context call
runs beside two appends, each gets about a third of the process, and the call the agent is blocked on takes
three times as long. A background request therefore steps aside at safe points while a foreground call runs
in this process: when it starts (config.lanes) and before each of its database statements outside a
transaction (never inside one, where it may hold a lock the foreground call needs). It waits until no
foreground call is left, at most its budget in all, so a steady stream of context calls delays a write but
never stalls it. Nothing is refused and nothing changes what any call returns: only the order in which the
process spends its time."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from providers.metrics import BACKGROUND_YIELD_SECONDS

_condition = threading.Condition()
_foreground_calls = 0  # written under _condition; read without it on the fast path (an int read is atomic)

# Seconds this background request may still spend stepping aside; None outside the background lane (a
# foreground call, a Celery task, a management command, the reads a foreground call runs beside itself).
_budget: contextvars.ContextVar[float | None] = contextvars.ContextVar("mnemo_lane_budget", default=None)


@contextmanager
def foreground() -> Iterator[None]:
    """Run the block as a foreground call: background requests of this process step aside until it ends.
    Inside it nothing steps aside, even on a thread that began in the background."""
    global _foreground_calls
    with _condition:
        _foreground_calls += 1
    token = _budget.set(None)
    try:
        yield
    finally:
        _budget.reset(token)
        with _condition:
            _foreground_calls -= 1
            if not _foreground_calls:
                _condition.notify_all()


@contextmanager
def background(budget_seconds: float) -> Iterator[None]:
    """Run the block in the background lane, stepping aside for at most `budget_seconds` in all."""
    token = _budget.set(max(0.0, budget_seconds))
    try:
        yield
    finally:
        _budget.reset(token)


def step_aside() -> float:
    """In the background lane, wait while a foreground call runs in this process, within what is left of the
    budget; the seconds waited. Costs a variable read when the lane is idle."""
    if not _foreground_calls:
        return 0.0
    budget = _budget.get()
    if not budget:
        return 0.0
    started = time.monotonic()
    with _condition:
        _condition.wait_for(lambda: not _foreground_calls, timeout=budget)
    waited = time.monotonic() - started
    _budget.set(max(0.0, budget - waited))
    BACKGROUND_YIELD_SECONDS.inc(waited)
    return waited


def foreground_calls() -> int:
    """Foreground calls running in this process now."""
    return _foreground_calls
