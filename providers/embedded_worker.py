"""The embedded mode's worker process. Without a broker the server queues its background tasks (message
vectors, compaction, the memory agent, document processing) to one child process of its own, started on
first use (`python -m providers.embedded_child`, that module is the child's side). Their Python work then
never holds the serving process's GIL: on a thread of the server, a busy Python task made every request of
that moment several times slower.

The protocol is JSON lines. Down the child's stdin, one task at a time (the next once the last is done):
{"n": number, "task": name, "args": [...]}. Up its stdout: {"started": number} as a task begins (read and
ignored), {"done": number} when a task (and what it queued in turn) has run, and {"kind", "payload"} for what
only the serving process can do (providers.background.server_notify: an event for its sockets, a retrieval
index to bring up to date). The child exits when its stdin closes, that is with the server; a child that
died is started again by the next task, and what it held is found again by the periodic sweeps."""

import json
import logging
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

CHILD_ENV = "MNEMO_EMBEDDED_WORKER_CHILD"


class EmbeddedWorker:
    """The serving process's side: queues tasks to the child, hears back from it."""

    def __init__(self, *, cwd: Any, on_message: Callable[[dict[str, Any]], None]) -> None:
        self._cwd = cwd
        self._on_message = on_message
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        # Tasks wait here, in the serving process, until the child is free: a task leaves `_waiting` when it
        # is handed over, before the child can read anything, so a request that arrives after that always
        # queues a run of its own. (Deduplicating against lines already in the child's pipe lost wake-ups:
        # the child could be reading the database while the server still counted its task as waiting.)
        self._backlog: deque[tuple[int, str, tuple[Any, ...]]] = deque()
        self._waiting: set[tuple[str, tuple[Any, ...]]] = set()
        self._current: tuple[int, subprocess.Popen[str]] | None = None  # handed to the child, not done
        self._number = 0
        self._process: subprocess.Popen[str] | None = None

    def submit(self, task: Any, args: tuple[Any, ...]) -> None:
        """Queue the task (once while the same task and arguments wait). Raises OSError when no child can
        be started."""
        key = (task.name, args)
        with self._lock:
            if key in self._waiting:
                return
            self._running()  # a child that cannot start is the caller's error, not the reader's
            self._number += 1
            self._backlog.append((self._number, task.name, args))
            self._waiting.add(key)
            self._dispatch()

    def join(self) -> None:
        """Wait until everything queued so far has run (or the child died)."""
        with self._lock:
            while self._backlog or self._current is not None:
                self._idle.wait()

    def _dispatch(self) -> None:
        """Hand the next waiting task to the child when it has none (the lock is held)."""
        while self._current is None and self._backlog:
            number, name, args = self._backlog.popleft()
            self._waiting.discard((name, args))
            try:
                process = self._running()
                assert process.stdin is not None
                process.stdin.write(json.dumps({"n": number, "task": name, "args": list(args)}, default=str))
                process.stdin.write("\n")
                process.stdin.flush()
            except OSError as exc:  # it died meanwhile, or cannot start: the sweeps find the work again
                logger.warning("the embedded worker did not take %s: %s", name, exc)
                continue
            self._current = (number, process)
        if self._current is None and not self._backlog:
            self._idle.notify_all()

    def stop(self) -> None:
        with self._lock:
            process, self._process = self._process, None
        if process is not None and process.poll() is None:
            assert process.stdin is not None
            process.stdin.close()  # the child's loop ends; it exits
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()

    def _running(self) -> "subprocess.Popen[str]":
        if self._process is not None and self._process.poll() is None:
            return self._process
        process = subprocess.Popen(  # this interpreter, this module
            [sys.executable, "-m", "providers.embedded_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            cwd=self._cwd,
            env={**os.environ, CHILD_ENV: "1"},
        )
        self._process = process
        threading.Thread(target=self._read, args=(process,), name="mnemo-worker-reader", daemon=True).start()
        return process

    def _read(self, process: "subprocess.Popen[str]") -> None:
        assert process.stdout is not None
        for line in process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                logger.warning("embedded worker said something unreadable: %.200s", line)
                continue
            if "started" in message:
                continue
            if "done" in message:
                self._done(message["done"])
            else:
                self._on_message(message)
        with self._lock:  # what this child held, and what waited for it, is lost (the sweeps find it again)
            if self._process is process:
                self._process = None
            if self._current is not None and self._current[1] is process:
                self._current = None
            self._backlog.clear()
            self._waiting.clear()
            self._idle.notify_all()
        logger.warning("the embedded worker exited (status %s)", process.wait())

    def _done(self, number: int) -> None:
        with self._lock:
            if self._current is not None and self._current[0] == number:
                self._current = None
            self._dispatch()
