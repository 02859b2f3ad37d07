"""How busy the machine was during the load, read from Linux's /proc: the CPU each part of the stack used
(the server, the workers, PostgreSQL, the soak's own clients) and the threads ready to run per core. The
soak runs them all on the same cores, so a call slower under the load than alone has mostly waited for a
core when more threads are ready than there are cores. Elsewhere than Linux the figures read n/a."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench._soak.stack import Stack, children

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User and system CPU of one process so far (0 once it has exited)."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    return 0.0


def _postgres_pids() -> list[int]:
    found = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            if comm.read_text().strip() == "postgres":
                found.append(int(comm.parent.name))
    return found


def _with_children(pids: list[int]) -> list[int]:
    return [p for pid in pids for p in (pid, *children(pid))]


def groups(stack: Stack) -> dict[str, list[int]]:
    """The processes of each part there is: an embedded server's worker process counts with the server (its
    child), a Celery worker's pool with the worker; PostgreSQL's backends are those alive when asked."""
    server = "server" if len(stack.procs) > 1 or "DATABASE_URL" in stack.env else "server and its worker"
    found = {
        server: _with_children([p.pid for p in stack.procs[:1]]),
        "Celery workers": _with_children([p.pid for p in stack.procs[1:]]),
        "PostgreSQL": _postgres_pids() if "DATABASE_URL" in stack.env else [],
        "soak clients": [os.getpid()],
    }
    return {name: pids for name, pids in found.items() if pids}


def _ready_threads() -> int | None:
    """Threads running or ready to run on the whole machine, this one included (/proc/stat)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("procs_running "):
                return int(line.split()[1])
    return None


@dataclass
class MachineLoad:
    """Started when the load starts, stopped when it stops."""

    stack: Stack
    every: float = 0.1
    started_cpu: dict[str, float] = field(default_factory=dict)
    cores_used: dict[str, float] = field(default_factory=dict)
    ready: list[int] = field(default_factory=list)
    seconds: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._pids = groups(self.stack)
        self.started_cpu = {name: sum(map(cpu_seconds, pids)) for name, pids in self._pids.items()}
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            ready = _ready_threads()
            if ready is not None:
                self.ready.append(ready - 1)  # not this sampler

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.seconds = time.monotonic() - self._began
        # Processes started during the load (a backend, a pool child) count from zero; exited ones are lost.
        now = groups(self.stack)
        for name, pids in self._pids.items():
            pids = pids + [p for p in now.get(name, []) if p not in pids]
            used = sum(map(cpu_seconds, pids)) - self.started_cpu[name]
            self.cores_used[name] = max(0.0, used) / self.seconds if self.seconds else 0.0

    def lines(self) -> list[list[str]]:
        cores = os.cpu_count() or 1
        if not self.ready:
            return [["CPU during the load, threads ready per core", "n/a (no /proc)"]]
        used = ", ".join(f"{name} {value:.2f}" for name, value in self.cores_used.items())
        mean = sum(self.ready) / len(self.ready)
        over = sum(r > cores for r in self.ready) / len(self.ready)
        return [
            [f"cores used during the load (of {cores})", used],
            [
                "threads ready to run per core during the load (mean; time above 1)",
                f"{mean / cores:.2f}; {over:.0%}",
            ],
        ]
