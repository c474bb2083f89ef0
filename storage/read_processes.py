"""Reads over HTTP in processes of their own, at a lower CPU priority, under the service.

Read threads inside a worker share its one GIL with the threads taking in events: a read
holding the GIL at nice +10 waits for a core while the events requests wait for the GIL,
and ten worst reads at once took ingestion's p99 from 5 ms to 194 ms (bench/reads.py). A
read process has its own interpreter and its own database connection, so the kernel's
priorities really apply: ingestion's threads get a core first, reads take what is left.

Each worker starts its read processes on its first read (a fresh interpreter, never a fork
of a worker with threads and open connections), one for each of `processes` reads at once.
A read is a module-level function and its arguments, pickled; it is called with the
process's Database first, inside the read budget, and its result comes back pickled.

A worker runs one read at a time (ReadGate, shared by its sets of read processes), and
the machine fewer at once than its cores (ReadSlots, shared by the workers): cores kept
busy by reads leave ingestion none of its own, however low the reads' priority. The
others wait, in a worker the site's own users and keys before shared links' viewers, at
most `wait` seconds, then are answered ReadsBusy (503, retry).

On SQLite the budget counts the read process's CPU, not the time since it started: at a
low priority on a busy machine a read gets the cores last, and a read that waited for one
is not "too expensive". Its statement is stopped by SQLite's progress handler once it has
used its budget; a read that has not answered within `longest` seconds whatever its CPU
(starved by other work, or Python work no statement budget stops) is killed and answered
ReadsBusy. On PostgreSQL the statement runs in the server's backend, at the server's
priority, so the budget is time (statement_timeout) and a process that has not answered
`GRACE` seconds past it is killed and the read answered ReadBudgetExceeded; a read there
uses one backend (no parallel workers, more processes at the server's priority). One that
died is replaced and the read answered ReadsBusy. A process reads its requests from a pipe
and exits when it closes, so none outlives its worker by more than one read.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from typing import Any

from storage.db import READ_BUDGET_CHECK_STEPS, ReadBudgetExceeded, StorageError
from storage.reads import ReadsBusy, read_within_budget

log = logging.getLogger("tally")
GRACE = 2.0
LONGEST = 30.0  # seconds a read on SQLite may take whatever CPU it got (its budget is CPU)
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


class ReadSlots:
    """At most `count` reads at once on this machine over one database, whichever worker
    runs them: a lock file each in the temporary folder, held (flock) by the read running
    in it, and let go by the kernel if its worker dies. Fewer than the cores, a core is
    always left to ingestion: PostgreSQL's backends run at the server's priority, and at
    any priority a read keeps its core's cache and its scheduling group's share."""

    POLL = 0.01  # seconds between two looks for a free slot

    def __init__(self, database: str, count: int, folder: str | None = None):
        digest = hashlib.sha256(database.encode()).hexdigest()[:16]
        folder = folder or tempfile.gettempdir()
        self.paths = [os.path.join(folder, f"tally-reads-{digest}-{n}.lock")
                      for n in range(max(1, count))]

    def take(self, wait: float | None,
             clock: Callable[[], float] = time.monotonic) -> int | None:
        """A held slot (a descriptor, for `give`), or ReadsBusy after `wait` seconds; None
        when the lock files cannot be opened (another user's): the read runs unlimited."""
        deadline = None if wait is None else clock() + wait
        while True:
            for path in self.paths:
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                except OSError as exc:
                    log.warning("reads are not limited across workers: %s", exc)
                    return None
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except BlockingIOError:
                    os.close(fd)
            if deadline is not None and clock() >= deadline:
                raise ReadsBusy(f"other reads kept this one waiting {wait:g} s")
            time.sleep(self.POLL)

    @staticmethod
    def give(fd: int) -> None:
        os.close(fd)  # the lock goes with it


def slots_for(config) -> ReadSlots:
    """The machine's read slots over `config`'s database: `config.read_slots`, or one fewer
    than the cores this process may use (at least one)."""
    count = config.read_slots or len(os.sched_getaffinity(0)) - 1
    return ReadSlots(config.database_url or os.path.abspath(config.db_path), count)


class ReadGate:
    """One read at a time in this process: `turn(first, wait)` holds it, taken by waiters
    with `first` before the others, and then one of the machine's `slots` when given; or
    raises ReadsBusy once `wait` seconds have passed."""

    def __init__(self, slots: ReadSlots | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.slots = slots
        self.clock = clock
        self._changed = threading.Condition()
        self._running = False
        self._waiting = self._waiting_first = 0
        self._pid: int | None = None

    @contextmanager
    def turn(self, first: bool, wait: float | None):
        asked = self.clock()
        with self._changed:
            if self._pid != os.getpid():  # a fork's parent's read is not ours
                self._running, self._waiting, self._waiting_first = False, 0, 0
                self._pid = os.getpid()
            self._waiting += 1
            self._waiting_first += first
            try:
                while self._running or (not first and self._waiting_first):
                    left = None if wait is None else wait - (self.clock() - asked)
                    if left is not None and left <= 0:
                        raise ReadsBusy(f"other reads kept this one waiting {wait:g} s")
                    self._changed.wait(left)
                self._running = True
            finally:
                self._waiting -= 1
                self._waiting_first -= first
                self._changed.notify_all()
        try:
            slot = None
            if self.slots is not None:
                left = None if wait is None else wait - (self.clock() - asked)
                slot = self.slots.take(left, self.clock)
            try:
                yield
            finally:
                if slot is not None:
                    self.slots.give(slot)
        finally:
            with self._changed:
                self._running = False
                self._changed.notify_all()

    def state(self) -> tuple[bool, int]:
        """(whether a read holds the turn, how many wait for it)."""
        with self._changed:
            return self._running, self._waiting


class ReadProcesses:
    """`call(read, *args)`: `read(db, *args)` in a read process, within the budget."""

    def __init__(self, config, seconds: float | None, *, processes: int = 1, nice: int = 10,
                 preload: tuple[str, ...] = (), gate: ReadGate | None = None,
                 first: bool = True, wait: float | None = None, longest: float = LONGEST,
                 clock: Callable[[], float] = time.monotonic):
        """`preload`: the modules of the reads, imported before a process says it is
        ready, so that no read's budget pays for them. `gate`: shared with the worker's
        other read processes (its own, without the machine's slots, when None); `first`: whether its reads go before
        those of sets that are not; `wait`: seconds a read waits for its turn and a free
        process (the budget when None)."""
        self.config = config
        self.preload = preload
        self.seconds = seconds
        self.processes = processes
        self.nice = nice
        self.gate = gate or ReadGate(clock=clock)
        self.first = first
        self.wait = seconds if wait is None else wait
        # SQLite's budget is the read's CPU (a starved read takes longer); PostgreSQL's is
        # time, so a process silent past it is doing work no statement budget stops.
        self.longest = (longest if not config.database_url or seconds is None
                        else seconds + GRACE)
        self.clock = clock
        self._idle: list[_Child] = []
        self._started = 0
        self._pid: int | None = None
        self._free = threading.Condition()

    def call(self, read: Callable[..., Any], *args: Any) -> Any:
        with self.gate.turn(self.first, self.wait):
            return self._call(read, args)

    def _call(self, read: Callable[..., Any], args: tuple) -> Any:
        child, _ = self._take(self.clock())
        try:
            payload = pickle.dumps((read, args))
            try:
                answer = child.ask(payload, self.longest if self.seconds is not None else 3600)
            except (TimeoutError, OSError, ValueError) as exc:
                self._lose(child)
                child = None
                if isinstance(exc, TimeoutError) and self.config.database_url:
                    raise ReadBudgetExceeded(self.seconds) from None
                if isinstance(exc, TimeoutError):
                    raise ReadsBusy(f"the read did not end within {self.longest:g} s: the"
                                    " machine is too busy") from None
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
                left = None if self.wait is None else self.wait - (self.clock() - asked)
                if left is not None and left <= 0:
                    raise ReadsBusy(f"no read process was free within {self.wait:g} s")
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
    db = open_database(config, parallel_query=False)
    _send(stdout, b"ready")
    seconds = config.read_budget
    check_steps = getattr(config, "read_budget_check_steps", READ_BUDGET_CHECK_STEPS)
    # SQLite's statements run in this process: its CPU is the read's.
    clock = time.process_time if db.dialect == "sqlite" else time.monotonic
    try:
        while (request := _receive(stdin)) is not None:
            read, args = pickle.loads(request)
            try:
                answer = ("ok", read_within_budget(
                    db, partial(read, db, *args), seconds, since=clock(), clock=clock,
                    check_steps=check_steps))
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
