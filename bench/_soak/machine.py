"""How busy the machine was during the load, read from Linux's /proc: the CPU each part of the stack used
(the server, the workers, PostgreSQL, the soak's own clients), the threads ready to run per core, and how
long the server's threads waited for a core for each second they ran. The soak runs them all on the same
cores, so a call slower under the load than alone has mostly waited for a core when more threads are ready
than there are cores. Elsewhere than Linux the figures read n/a."""

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


def server_pids(stack: Stack) -> list[int]:
    return _with_children([p.pid for p in stack.procs[:1]])


def groups(stack: Stack) -> dict[str, list[int]]:
    """The processes of each part there is: an embedded server's worker process counts with the server (its
    child), a Celery worker's pool with the worker; PostgreSQL's backends are those alive when asked."""
    server = "server" if len(stack.procs) > 1 or "DATABASE_URL" in stack.env else "server and its worker"
    found = {  # the server first: lines() names its threads after it
        server: server_pids(stack),
        "Celery workers": _with_children([p.pid for p in stack.procs[1:]]),
        "PostgreSQL": _postgres_pids() if "DATABASE_URL" in stack.env else [],
        "soak clients": [os.getpid()],
    }
    return {name: pids for name, pids in found.items() if pids}


def thread_times(pids: list[int]) -> dict[int, tuple[float, float]]:
    """Per thread of these processes: seconds on a core and seconds ready to run but waiting for one
    (/proc/PID/task/TID/schedstat)."""
    found = {}
    for pid in pids:
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                ran, waited = stat.read_text().split()[:2]
                found[int(stat.parent.name)] = (int(ran) / 1e9, int(waited) / 1e9)
    return found


def server_wait(stack: Stack, before: dict[int, tuple[float, float]]) -> float | None:
    """Seconds the server's threads waited for a core per second they ran, since `before` (thread_times):
    threads started meanwhile count from zero, threads that ended are lost."""
    after = thread_times(server_pids(stack))
    ran = sum(r - before.get(tid, (0.0, 0.0))[0] for tid, (r, _w) in after.items())
    waited = sum(w - before.get(tid, (0.0, 0.0))[1] for tid, (_r, w) in after.items())
    return waited / ran if ran > 0 else None


def _ready_threads() -> int | None:
    """Threads running or ready to run on the whole machine, this one included (/proc/stat)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("procs_running "):
                return int(line.split()[1])
    return None


def cpu_clock() -> tuple[float, float] | None:
    """(steal, all) seconds of the machine's cores so far (/proc/stat's first line sums every core: user nice
    system idle iowait irq softirq steal): steal is time a virtual machine's cores were ready but the
    hypervisor ran someone else's work on them, which no process of this machine shows."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        jiffies = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
        return jiffies[7] / _TICKS, sum(jiffies) / _TICKS
    return None


def steal_share(before: tuple[float, float] | None) -> float | None:
    """The share of the cores' time the hypervisor took since `before` (cpu_clock)."""
    after = cpu_clock()
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


@dataclass
class MachineLoad:
    """Started when the load starts, stopped when it stops."""

    stack: Stack
    every: float = 0.1
    started_cpu: dict[str, float] = field(default_factory=dict)
    cores_used: dict[str, float] = field(default_factory=dict)
    ready: list[int] = field(default_factory=list)
    server_waited: float | None = None  # seconds the server's threads waited for a core per second on one
    quiet_waited: float | None = None  # the same while one client asked after the load (the baseline)
    stolen: float | None = None  # the share of the cores' time the hypervisor took during the load
    quiet_stolen: float | None = None  # the same during the baseline
    seconds: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._pids = groups(self.stack)
        self.started_cpu = {name: sum(map(cpu_seconds, pids)) for name, pids in self._pids.items()}
        self._server_threads = thread_times(server_pids(self.stack))
        self._clock = cpu_clock()
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
        self.server_waited = server_wait(self.stack, self._server_threads)
        self.stolen = steal_share(self._clock)

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
            [
                f"{next(iter(self.cores_used))} threads: seconds waiting for a core per second on one"
                " (under the load; one client after it)",
                "; ".join(_ratio(w) for w in (self.server_waited, self.quiet_waited)),
            ],
            [
                "cores' time taken by the hypervisor (steal; under the load; one client after it)",
                "; ".join("n/a" if s is None else f"{s:.0%}" for s in (self.stolen, self.quiet_stolen)),
            ],
        ]
