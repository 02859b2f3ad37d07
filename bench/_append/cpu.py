"""Who used the cores during a phase (server, PostgreSQL, this load generator, everyone else), from /proc.

Other people's jobs may share the machine; splitting the cores' time shows whether a figure was taken on a
quiet machine.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

CORES = len(os.sched_getaffinity(0))


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class CpuShare:
    """CPU seconds spent during a phase, by whom, and the wall time of all cores together."""

    server: float
    postgres: float
    client: float
    other: float
    capacity: float  # cores x seconds

    def postgres_is_other(self) -> None:
        """On SQLite the database runs inside the server; PostgreSQL busy meanwhile is someone else's."""
        self.other += self.postgres
        self.postgres = 0.0

    def split(self) -> str:
        idle = max(0.0, self.capacity - self.server - self.postgres - self.client - self.other)
        parts = [
            ("server", self.server),
            ("pg", self.postgres),
            ("client", self.client),
            ("other", self.other),
        ]
        return " ".join(f"{name} {value / self.capacity:.0%}" for name, value in [*parts, ("idle", idle)])


@dataclass
class CpuSnapshot:
    server: dict[int, float]  # pid -> CPU seconds so far
    postgres: dict[int, float]
    client: float
    busy: float
    total: float

    @classmethod
    def take(cls, server_pids: list[int]) -> CpuSnapshot:
        processes: dict[int, tuple[int, str, float]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                raw = (entry / "stat").read_text()
            except OSError:
                continue
            name = raw[raw.index("(") + 1 : raw.rindex(")")]
            fields = raw.rsplit(")", 1)[1].split()
            processes[int(entry.name)] = (
                int(fields[1]),
                name,
                (int(fields[11]) + int(fields[12])) / CLOCK_TICKS,
            )
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in processes.items():
            children.setdefault(ppid, []).append(pid)
        server, todo = {}, list(server_pids)
        while todo:
            pid = todo.pop()
            if pid in processes:
                server[pid] = processes[pid][2]
            todo.extend(children.get(pid, []))
        postgres = {pid: cpu for pid, (_, name, cpu) in processes.items() if name == "postgres"}
        usage = resource.getrusage(resource.RUSAGE_SELF)
        # The first line of /proc/stat sums every core: user nice system idle iowait irq softirq steal.
        jiffies = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
        total = sum(jiffies) / CLOCK_TICKS
        busy = total - (jiffies[3] + jiffies[4]) / CLOCK_TICKS
        return cls(server, postgres, usage.ru_utime + usage.ru_stime, busy, total)

    def since(self, before: CpuSnapshot) -> CpuShare:
        # Per process, so a backend that exited meanwhile (someone else's) does not count negative.
        def delta(now: dict[int, float], then: dict[int, float]) -> float:
            return sum(cpu - then.get(pid, 0.0) for pid, cpu in now.items())

        server, postgres = delta(self.server, before.server), delta(self.postgres, before.postgres)
        client = self.client - before.client
        other = max(0.0, (self.busy - before.busy) - server - postgres - client)
        return CpuShare(server, postgres, client, other, self.total - before.total)
