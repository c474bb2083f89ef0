"""Reads over HTTP in processes of their own, at nice +10, under the service.

Read threads inside a worker share its one GIL with the threads taking in events: a read
holding the GIL at nice +10 waits for a core while the events requests wait for the GIL,
and ten worst reads at once took ingestion's p99 from 5 ms to 194 ms (bench/reads.py). A
read process has its own interpreter and its own database connection, so the kernel's
priorities really apply: ingestion's threads get a core first, reads take what is left.

Each worker starts its read processes on its first read (a fresh interpreter, never a fork
of a worker with threads and open connections), one for each of `processes` reads at once.
A read is a module-level function and its arguments, pickled; it is called with the
process's Database first, inside the read budget, and its result comes back pickled. The
process's own budget stops its statement (SQLite's progress handler, PostgreSQL's
statement_timeout); a process that has not answered `GRACE` seconds past the budget is
killed and the read answered ReadBudgetExceeded, one that died is replaced and the read
answered ReadsBusy (503). A process reads its requests from a pipe and exits when it
closes, so none outlives its worker by more than one read's budget.
"""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from storage.db import READ_BUDGET_CHECK_STEPS, ReadBudgetExceeded, StorageError
from storage.reads import ReadsBusy, read_within_budget

log = logging.getLogger("tally")
GRACE = 2.0
STARTING = 60.0  # seconds a new read process may take to be ready (a loaded machine)
_HEADER = struct.Struct("!I")
FROZEN_ARGUMENT = "--tally-read-process"


def _send(stream, payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def _receive(stream) -> bytes | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    size = _HEADER.unpack(header)[0]
    payload = stream.read(size)
    return payload if len(payload) == size else None


class _Child:
    def __init__(self, config, nice: int, preload: tuple[str, ...]):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        # A PyInstaller binary has no `-c`: it runs serve() when given FROZEN_ARGUMENT.
        command = ([sys.executable, FROZEN_ARGUMENT] if getattr(sys, "frozen", False) else
                   [sys.executable, "-c", "from storage.read_processes import serve; serve()"])
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        _send(self.proc.stdin, pickle.dumps((config, nice, preload)))
        ready, _, _ = select.select([self.proc.stdout], [], [], STARTING)
        if not ready or _receive(self.proc.stdout) != b"ready":
            self.end()
            raise OSError("the read process did not start")

    def ask(self, request: bytes, wait: float) -> bytes | None:
        """The answer, or None when the process died; TimeoutError past `wait`."""
        _send(self.proc.stdin, request)
        ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, wait))
        if not ready:
            raise TimeoutError
        return _receive(self.proc.stdout)

    def end(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.proc.kill()
        self.proc.wait()


class ReadProcesses:
    """`call(read, *args)`: `read(db, *args)` in a read process, within the budget."""

    def __init__(self, config, seconds: float | None, *, processes: int = 1, nice: int = 10,
                 preload: tuple[str, ...] = (), clock: Callable[[], float] = time.monotonic):
        """`preload`: the modules of the reads, imported before a process says it is
        ready, so that no read's budget pays for them."""
        self.config = config
        self.preload = preload
        self.seconds = seconds
        self.processes = processes
        self.nice = nice
        self.clock = clock
        self._idle: list[_Child] = []
        self._started = 0
        self._pid: int | None = None
        self._free = threading.Condition()

    def call(self, read: Callable[..., Any], *args: Any) -> Any:
        asked = self.clock()
        child, fresh = self._take(asked)
        if fresh:  # the budget is the read's: a process's start is not counted in it
            asked = self.clock()
        try:
            payload = pickle.dumps((read, args, self.clock() - asked))
            limit = None if self.seconds is None else self.seconds + GRACE
            try:
                answer = child.ask(payload, limit - (self.clock() - asked) if limit else 3600)
            except (TimeoutError, OSError, ValueError) as exc:
                self._lose(child)
                child = None
                if isinstance(exc, TimeoutError):
                    raise ReadBudgetExceeded(self.seconds) from None
                raise ReadsBusy("the read process stopped; it is being replaced") from None
            if answer is None:
                self._lose(child)
                child = None
                raise ReadsBusy("the read process stopped; it is being replaced")
            kind, value = pickle.loads(answer)
        finally:
            if child is not None:
                self._give(child)
        if kind == "ok":
            return value
        if kind == "budget":
            raise ReadBudgetExceeded(value)
        raise value

    def _take(self, asked: float) -> tuple[_Child, bool]:
        """(a process, whether it was started for this read)."""
        with self._free:
            if self._pid != os.getpid():  # a fork's parent's processes are not ours
                self._idle, self._started, self._pid = [], 0, os.getpid()
            while True:
                if self._idle:
                    return self._idle.pop(), False
                if self._started < self.processes:
                    self._started += 1
                    break
                left = None if self.seconds is None else self.seconds - (self.clock() - asked)
                if left is not None and left <= 0:
                    raise ReadsBusy(
                        f"no read process was free within the {self.seconds:g} s budget")
                self._free.wait(left)
        try:
            return _Child(self.config, self.nice, self.preload), True
        except OSError as exc:
            with self._free:
                self._started -= 1
                self._free.notify()
            raise StorageError(f"could not start a read process: {exc}") from exc

    def _give(self, child: _Child) -> None:
        with self._free:
            self._idle.append(child)
            self._free.notify()

    def _lose(self, child: _Child) -> None:
        child.end()
        with self._free:
            self._started -= 1
            self._free.notify()

    def pids(self) -> list[int]:
        with self._free:
            return [child.proc.pid for child in self._idle]

    def start(self) -> None:
        """Nothing to start: the processes are made on the first read."""

    def stop(self, timeout: float = 0) -> None:
        with self._free:
            idle, self._idle = self._idle, []
            self._started -= len(idle)
        for child in idle:
            child.end()


def serve() -> None:
    """A read process's loop: requests on stdin, answers on stdout, until stdin closes."""
    from storage.backend import open_database

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing a read prints may corrupt the answers
    setup = _receive(stdin)
    if setup is None:
        return
    config, nice, preload = pickle.loads(setup)
    for module in preload:
        importlib.import_module(module)
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass
    db = open_database(config)
    _send(stdout, b"ready")
    seconds = config.read_budget
    check_steps = getattr(config, "read_budget_check_steps", READ_BUDGET_CHECK_STEPS)
    try:
        while (request := _receive(stdin)) is not None:
            read, args, waited = pickle.loads(request)
            since = time.monotonic() - waited
            try:
                answer = ("ok", read_within_budget(
                    db, partial(read, db, *args), seconds, since=since, check_steps=check_steps))
            except ReadBudgetExceeded as exc:
                answer = ("budget", exc.seconds)
            except Exception as exc:  # the caller's to answer, as in its own thread
                answer = ("error", exc)
            finally:
                db.release()
            try:
                payload = pickle.dumps(answer)
            except Exception as exc:
                payload = pickle.dumps(("error", StorageError(f"{type(answer[1]).__name__}: {exc}")))
            _send(stdout, payload)
    finally:
        db.close()
