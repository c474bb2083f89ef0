"""Reads over HTTP run on a few threads of their own, at a lower CPU priority than the
threads that take in events, each under its read budget (Database.read_budget). The
server runs them in read processes instead (storage/read_processes.py), where they do not
share the worker's GIL; the application built in code (the tests) keeps these threads.

A gunicorn worker serves ingestion and reads on the same request threads. A report that
counts live keeps a core busy until its budget runs out, and ten of them at once would
keep every core busy while events wait for one. So each worker hands its reads to
`threads` threads started at nice +`nice`: when ingestion or the flush needs a core it
gets it first (Linux weighs a nice-0 thread about nine times a nice-10 one) and reads
take what is left. An unprivileged thread may lower its own priority but never raise it
again, hence threads kept for reads only (on a system without per-thread priorities they
run at the worker's).

The budget counts from when the read was asked for, so a read that waited for a free
thread has less left; one that waited past its whole budget is not started and is
answered ReadsBusy (503, retry) rather than "too expensive", which it may not be.

On PostgreSQL with a read replica (TALLY_DATABASE_READ_URL), reads run on the replica
while it is usable, and again on the primary when it fails them (storage/replica.py).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from storage.db import READ_BUDGET_CHECK_STEPS, ReplicaLost, StorageBusy

log = logging.getLogger("tally")
T = TypeVar("T")


def read_within_budget(db, read: Callable[[], T], seconds: float | None, *, since: float,
                       check_steps: int = READ_BUDGET_CHECK_STEPS,
                       clock: Callable[[], float] = time.monotonic) -> T:
    """`read()` within `seconds` counted from `since` (a reading of `clock`): on the replica
    while it is usable, and when it fails mid-way on the primary, in what is left."""
    def once() -> T:
        with db.read_budget(seconds, check_steps=check_steps, clock=clock, since=since):
            return read()

    try:
        with db.replica_reads():
            return once()
    except ReplicaLost:
        return once()


class ReadsBusy(StorageBusy):
    """Every read thread stayed taken for the read's whole budget."""


class ReadPool:
    """`run(read)`: `read()` on one of the process's read threads, within the budget."""

    def __init__(self, db, seconds: float | None, *, check_steps: int = READ_BUDGET_CHECK_STEPS,
                 threads: int = 2, nice: int = 10,
                 clock: Callable[[], float] = time.monotonic):
        self.db = db
        self.clock = clock
        self.seconds = seconds
        self.check_steps = check_steps
        self.threads = threads
        self.nice = nice
        self._executor: ThreadPoolExecutor | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()
        self._asked = 0  # reads asked for and not yet answered

    def call(self, read: Callable[..., T], *args) -> T:
        """`read(db, *args)` on a read thread (storage/read_processes.py: in a process)."""
        return self.run(lambda: read(self.db, *args))

    def run(self, read: Callable[[], T]) -> T:
        asked = self.clock()
        # The caller waits without a connection: on PostgreSQL one held while waiting would
        # be one less in the pool for the requests taking in events.
        self.db.release()
        pool = self._pool()
        with self._lock:
            waits = self._asked >= self.threads  # every thread taken: it queues
            self._asked += 1
        try:
            return pool.submit(self._read, read, asked, waits).result()
        finally:
            with self._lock:
                self._asked -= 1

    def _read(self, read: Callable[[], T], asked: float, waited: bool) -> T:
        if waited and self.seconds is not None and self.clock() - asked >= self.seconds:
            raise ReadsBusy(f"no read thread was free within the {self.seconds:g} s budget")
        try:
            return read_within_budget(self.db, read, self.seconds, since=asked,
                                      check_steps=self.check_steps, clock=self.clock)
        finally:
            self.db.release()

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None or self._pid != os.getpid():
                # A process makes its own threads after the fork; a parent's are left alone.
                self._asked = 0
                self._executor = ThreadPoolExecutor(
                    self.threads, thread_name_prefix="tally-read", initializer=self._lower)
                self._pid = os.getpid()
            return self._executor

    def _lower(self) -> None:
        if not sys.platform.startswith("linux") or not self.nice:
            return
        thread = threading.get_native_id()
        try:
            now = os.getpriority(os.PRIO_PROCESS, thread)
            os.setpriority(os.PRIO_PROCESS, thread, min(19, now + self.nice))
        except OSError as exc:
            log.info("read threads keep the worker's priority: %s", exc)

    def start(self) -> None:
        """Nothing to start: the threads are made on the first read."""

    def stop(self, timeout: float = 0) -> None:
        """Reads under way end within their budget; the threads are not waited for."""
        with self._lock:
            if self._executor is not None and self._pid == os.getpid():
                self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
