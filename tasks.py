"""Tally's background duties, in one list (like GoatCounter's cron.Tasks).

Each worker runs them on one thread, started by Tally.start() after the fork and stopped
by Tally.stop(). A duty runs every `every` seconds (the first time one tick after start,
or `first` seconds after it);
one that fails is logged and runs again at its next turn. The events flush is not among
them: it has its own thread (ingest/flusher.py), woken by the queue as events arrive.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("tally")


@dataclass(frozen=True)
class Task:
    name: str
    every: float  # seconds between runs
    run: Callable[[], None]
    first: float = 0.0  # seconds from the start to the first run (0: at the first tick)


class Tasks:
    """Runs the tasks when due on one thread (a service: start() and stop(timeout))."""

    def __init__(self, tasks: list[Task], clock: Callable[[], float] = time.monotonic,
                 tick: float = 1.0):
        self.tasks = list(tasks)
        self.clock = clock
        self.tick = tick
        self._due: dict[str, float] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def run_due(self) -> list[str]:
        """Run every task whose time has come; the names of those run."""
        now = self.clock()
        ran = []
        for task in self.tasks:
            if self._due.setdefault(task.name, now + task.first) > now:
                continue
            self._due[task.name] = now + task.every
            ran.append(task.name)
            try:
                task.run()
            except Exception as exc:
                log.warning("background task %r failed (%s: %s); it runs again in %.0f s",
                            task.name, type(exc).__name__, exc, task.every)
        return ran

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="tally-tasks", daemon=True)
        self._thread.start()

    def stopping(self) -> bool:
        """Whether stop() was called: a long duty checks it between its steps."""
        return self._stopping.is_set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopping.wait(self.tick):
            self.run_due()
