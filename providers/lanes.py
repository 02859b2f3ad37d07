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
import hashlib
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

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
        if _foreground_calls == 1:
            _host_publish(True)
    token = _budget.set(None)
    try:
        yield
    finally:
        _budget.reset(token)
        with _condition:
            _foreground_calls -= 1
            if not _foreground_calls:
                _host_publish(False)
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


# --- across the processes of one machine -------------------------------------------------------------------
#
# A Celery worker or the embedded worker process embeds on the same cores as the server when they share a
# machine: under load a context call waited for a core at each of its database round trips. Each server
# process marks in a small shared-memory board (one slot per process: its pid and whether a foreground call
# runs in it) when its foreground lane is busy; background work on the machine reads the board between its
# batches and waits while a slot is marked, at most MNEMO_TASK_YIELD_MS each time, so a steady stream of
# context calls slows it but never stops it. Processes on other machines share no cores and no board.

_SLOTS = 256
_SLOT = struct.Struct("<II")  # pid, foreground lane busy (0 or 1)
_HOST_POLL_SECONDS = 0.002
_board_lock = threading.Lock()
_board: mmap.mmap | None = None
_board_of: Path | None = None  # the MNEMO_VAR_DIR the board was opened for


def host_board_path() -> Path:
    """In /dev/shm when the machine has it (memory, never a network disk), named after the deployment's
    MNEMO_VAR_DIR, which its server and worker processes share."""
    name = f"mnemo-lanes-{os.getuid()}-" + hashlib.sha256(str(settings.VAR_DIR).encode()).hexdigest()[:16]
    shm = Path("/dev/shm")  # noqa: S108 - opened without following links, and only if it is ours (_board_open)
    return shm / name if shm.is_dir() else settings.VAR_DIR / name


def _host_board() -> mmap.mmap | None:
    global _board, _board_of
    with _board_lock:
        if _board_of != settings.VAR_DIR:
            _board, _board_of = _board_open(host_board_path()), settings.VAR_DIR
        return _board


def _board_open(path: Path) -> mmap.mmap | None:
    size = _SLOTS * _SLOT.size
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            stat = os.fstat(fd)
            if stat.st_uid != os.getuid():  # planted by another user: not read, not written
                return None
            if stat.st_size < size:
                os.ftruncate(fd, size)
            return mmap.mmap(fd, size)
        finally:
            os.close(fd)
    except OSError:  # no shared memory to be had: the lanes stay within each process
        return None


def _host_publish(busy: bool) -> None:
    board = _host_board()
    if board is not None:
        pid = os.getpid()
        _SLOT.pack_into(board, (pid % _SLOTS) * _SLOT.size, pid, int(busy))


def host_foreground_busy() -> bool:
    """Whether a server process on this machine is running a foreground call. A slot left marked by a
    process that died does not count."""
    board = _host_board()
    if board is None:
        return False
    return any(busy and _alive(pid) for pid, busy in _SLOT.iter_unpack(board))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def host_step_aside(max_seconds: float) -> float:
    """For background work between its batches: wait while a server process on this machine runs a
    foreground call, at most `max_seconds`; the seconds waited."""
    if max_seconds <= 0 or not host_foreground_busy():
        return 0.0
    started = time.monotonic()
    while time.monotonic() - started < max_seconds and host_foreground_busy():
        time.sleep(_HOST_POLL_SECONDS)
    waited = time.monotonic() - started
    BACKGROUND_YIELD_SECONDS.inc(waited)
    return waited
