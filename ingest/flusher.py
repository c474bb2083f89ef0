"""The thread that drains one worker's EventQueue into the database.

Every TALLY_FLUSH_INTERVAL seconds (sooner when a quarter of the queue is waiting, its
flush_at, or when asked), it swaps the waiting units out under the queue's lock, enriches
them and writes them with its own connection: one executemany in one transaction, through
`write(conn, batch)` (on SQLite the batch is decided before BEGIN IMMEDIATE and checked
under it: ingest.pipeline.BatchWriter). When the database is locked or failing it keeps
the batch and retries with backoff; the queue then fills and requests get 503. On a full disk it stores
the batch in smaller parts, as many as fit, and waits for space for the rest. Any other failure
is the data's: the batch is split until the failing events are found and set aside in
dead_letters, and everything else is stored. `stop()` closes the
queue (later offers are refused), wakes the thread for a final flush and joins it.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable

import metrics
from enrichment.enricher import Enricher, EventBatch
from ingest.pipeline import BatchWriter, collector_paused, enrich
from ingest.queue import Accepted, EventQueue
from quota.usage import counted_events
from storage import deadletters
from storage.connection import Connection
from storage.db import (
    Database,
    StorageBusy,
    StorageError,
    is_disk_full,
    is_transient_failure,
)
from storage.replan import ReplanSchedule
from storage.sessions import FLUSH_READS

log = logging.getLogger("tally")

# On PostgreSQL the flush's statements (and its triggers' and foreign keys' checks) are
# planned once on its connection, by their first runs. Without statistics (autovacuum off,
# or not yet run on tables that grew from empty) the planner takes site_id for a row's key:
# its plans joined a site's customers to a batch's visitors on site_id alone, every
# customer once for each visitor, and planning again on larger tables did not always
# help. So the flush has the tables it reads analyzed (and its plans made again) each time
# the events stored on its connection double from this many.
REPLAN_FIRST = 1_000

# Forks of this process so far, as a child sees them: a Flusher started before the last
# fork has no thread in this process. Comparing it costs a request far less than
# os.getpid(), a system call.
_forks = 0


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


class Flusher:
    def __init__(
        self,
        db: Database,
        queue: EventQueue,
        enricher: Enricher,
        *,
        interval: float,
        quota=None,
        write: Callable[..., None] | None = None,
        busy_timeout_ms: int = 1_000,
        backoff: tuple[float, float] = (0.05, 1.0),
        clock: Callable[[], float] = time.time,
    ):
        self.db = db
        self.queue = queue
        self.enricher = enricher
        self.interval = interval
        self.quota = quota  # told when a flush transaction starts and ends (quota.usage)
        self.write = write if write is not None else BatchWriter()
        self.busy_timeout_ms = busy_timeout_ms
        self.backoff = backoff
        self.failures = 0  # flush attempts that failed and were retried
        self.stored_events = 0
        self.set_aside_events = 0  # stored in dead_letters instead of events
        self.clock = clock
        self._conn: Connection | None = None
        self._replans = ReplanSchedule(REPLAN_FIRST)  # events stored on the connection
        self._thread: threading.Thread | None = None
        # On SQLite at most a quarter of the queue a transaction: the write lock is held
        # for one such part at a time, so the other workers' flushes and payments wait
        # for one part, not for everything this worker took. PostgreSQL stores everything
        # taken in one transaction: its per-transaction cost made smaller parts slower
        # (half the single events answered 503 in the bench).
        self.part_events = (max(1, queue.max_events // 4) if db.dialect == "sqlite"
                            else queue.max_events)
        self._pid: int | None = None
        self._started_after_fork = -1  # _forks when start() ran
        self._start_lock = threading.Lock()
        self._rounds = threading.Condition(threading.Lock())
        self._requested = 0  # flush_now() tickets handed out
        self._completed = 0  # tickets whose flush is done
        self._give_up_at: float | None = None  # time.monotonic() after which stop() gives up

    # lifecycle -------------------------------------------------------------
    def start(self) -> None:
        with self._start_lock:
            if self._pid == os.getpid() and self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="tally-flush", daemon=True)
            self._thread.start()
            self._pid = os.getpid()
            self._started_after_fork = _forks

    def stop(self, timeout: float = 25.0) -> None:
        """Refuse new events, flush everything held and wait for it at most `timeout` s."""
        self._give_up_at = time.monotonic() + max(0.0, timeout - min(1.0, timeout / 10))
        self.queue.close()
        thread = self._thread
        if thread is None or self._pid != os.getpid():
            return
        thread.join(timeout)
        if thread.is_alive():
            log.error("flush thread still busy after %.0f s; %d events not stored",
                      timeout, self.queue.held)

    def submit(self, unit: Accepted) -> bool:
        """Queue a request's events as one unit; False when they do not all fit."""
        if self._started_after_fork != _forks:
            self.start()  # safety net for a process where start() was never called
        return self.queue.offer(unit)

    def flush_now(self, timeout: float = 10.0) -> bool:
        """Store everything submitted before this call; False if not done within `timeout`."""
        if self._pid != os.getpid():
            self.start()
        with self._rounds:
            self._requested += 1
            ticket = self._requested
        self.queue.wake()
        with self._rounds:
            return self._rounds.wait_for(lambda: self._completed >= ticket, timeout)

    # the thread ------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.enricher.warm_up()
        except Exception:
            log.exception("warming up the user-agent parsers failed")
        try:
            due = time.monotonic() + self.interval
            while True:
                if not self.queue.closed:
                    self.queue.wait(due - time.monotonic())
                closing = self.queue.closed  # read before take(): nothing is offered after
                with self._rounds:
                    ticket = self._requested
                due = time.monotonic() + self.interval
                metrics.queue_depth(self.queue.held)
                # Each part is let go once stored, so that the events of a flush are not
                # held beside those the queue takes in meanwhile (at a worker's highest rate
                # the queue is full again by then: docs/perf-notes.md, "Worker memory").
                parts = _parts(self.queue.take(), self.part_events)
                parts.reverse()
                while parts:
                    self._store(parts.pop())
                with self._rounds:
                    self._completed = ticket
                    self._rounds.notify_all()
                if closing:
                    return
        finally:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _store(self, units: list[Accepted]) -> None:
        """Store the units, retrying only what a retry can fix.

        A transient failure (busy, locked, I/O) keeps everything not yet stored and
        retries it with backoff. A full disk may still hold a smaller transaction: the
        failing part is split in two until a part fits, and once one is stored the rest is
        tried whole again, so a batch too big for the space left is stored in as few parts
        as fit; one event that does not fit waits for space with everything else kept
        (never set aside). Any other failure splits the failing part in two until it is
        one event, which is set aside in dead_letters with the reason: one event never
        holds up another.
        """
        pending: list[tuple[list[Accepted], str | None]] = [(units, None)]  # (part, reason)
        delay, max_delay = self.backoff
        started = time.monotonic()
        stored = set_aside = split = 0
        while pending:
            part, reason = pending[-1]
            try:
                conn = self._connection()
                if reason is None:
                    stored += self._write(conn, part)
                else:
                    self._set_aside(conn, part, reason)
                    set_aside += 1
                pending.pop()
                self.queue.stored(part)
                if split:
                    # The disk was full: let the next part reuse the space this one took
                    # in the write-ahead log, and try everything left in one go.
                    self.db.checkpoint(conn)
                    pending = _merged(pending)
                delay = self.backoff[0]  # progress: a later wait starts short again
                continue
            except Exception as exc:
                self.failures += 1
                failure = exc
            if not isinstance(failure, (StorageBusy, sqlite3.OperationalError)):
                self._drop_connection()
            if reason is None and not is_transient_failure(failure):
                pending.pop()
                halves = _split(part)
                if halves is None:
                    pending.append((part, _reason(failure)))
                else:
                    pending += [(halves[1], None), (halves[0], None)]  # first half first
                continue
            if reason is None and is_disk_full(failure):
                halves = _split(part)
                if halves is not None:
                    pending.pop()
                    pending += [(halves[1], None), (halves[0], None)]
                    split += 1
                    continue
            else:
                # A transient failure, or even the one-row write to dead_letters failed: the
                # database is what fails, so everything not yet stored is kept and retried
                # whole (its events may all be storable once the database recovers).
                pending = [([unit for part, _ in pending for unit in part], None)]
            rest = [unit for part, _ in pending for unit in part]
            held = sum(len(unit.events) for unit in rest)
            if self._give_up_at is not None and time.monotonic() >= self._give_up_at:
                log.error("shutting down: %d accepted events could not be stored: %s",
                          held, failure)
                self.queue.stored(rest)
                break
            log.warning("storing %d events failed (%s: %s); keeping them, retry in %.2f s",
                        held, type(failure).__name__, failure, delay)
            pause = delay
            if self._give_up_at is not None:
                pause = min(pause, max(0.0, self._give_up_at - time.monotonic()))
            time.sleep(pause)
            delay = min(delay * 2, max_delay)
        self.stored_events += stored
        if split:
            log.warning("disk full: stored %d events in smaller transactions (%d splits)",
                        stored, split)
        if stored:
            metrics.events_flushed(stored, time.monotonic() - started)
        if set_aside:
            self.set_aside_events += set_aside
            log.error("flush: stored %d events, set aside %d that cannot be stored"
                      " (tally deadletter list)", stored, set_aside)

    def _write(self, conn: Connection, units: list[Accepted]) -> int:
        if self.db.dialect == "postgres" and self._replans.due():
            try:
                conn.analyze(FLUSH_READS)
            except Exception as exc:  # noqa: BLE001 - statistics never hold up a batch
                log.warning("flush: analyzing its tables failed (%s: %s)", type(exc).__name__, exc)
        # The collector waits from enrich to the commit: the batch's and the plan's objects
        # are young until then, and a pass between two steps would traverse them all (on
        # PostgreSQL such passes cost the flush thread about 0.5 us an event).
        with collector_paused():
            batch = enrich(self.enricher, conn, units)
            sites = {unit.site_id for unit in units}
            # On SQLite, one writer at a time: the batch is decided before the write lock
            # (BatchWriter.prepare) and only written under it.
            prepare = getattr(self.write, "prepare", None)
            if prepare is None or self.db.dialect != "sqlite":
                self._commit(conn, batch, sites)
            else:
                self._commit(conn, batch, sites, prepare(conn, batch))
        self._replans.add(len(batch.rows))
        return len(batch.rows)

    def _set_aside(self, conn: Connection, units: list[Accepted], reason: str) -> None:
        (unit,) = units
        (event,) = unit.events
        with self.db.transaction(conn):
            deadletters.set_aside(conn, [(unit.site_id, unit.account_id, unit.month, reason,
                                          deadletters.event_json(event))],
                                  int(self.clock() * 1000))
        metrics.events_dead_lettered(1)
        log.error("set aside an event of site %d that cannot be stored: %s", unit.site_id, reason)
        if self.quota is not None and unit.counted:
            self.quota.release((unit.account_id, unit.month), unit.counted,
                               unit.counted if unit.anonymous else 0)

    def _commit(self, conn: Connection, batch: EventBatch, sites: set[int],
                prepared=None) -> None:
        quota = self.quota
        if quota is not None:
            quota.begin_commit()
        try:
            # Only these sites' rows and their accounts' usage are written: on PostgreSQL
            # other sites' flushes and payments go on meanwhile.
            with self.db.transaction(conn, sites=sites):
                if prepared is None:
                    self.write(conn, batch)
                else:
                    self.write(conn, batch, prepared)
        except BaseException:
            batch.usage_totals.clear()
            batch.anonymous_totals.clear()
            if quota is not None:
                quota.end_commit()
            raise
        if quota is not None:
            quota.end_commit(batch.usage, batch.usage_totals, batch.anonymous_usage,
                             batch.anonymous_totals)

    def _connection(self) -> Connection:
        # A PostgreSQL connection the server dropped is closed, and one whose pipeline
        # failed part way no longer prepares (PostgresConnection.stop_preparing): a new
        # one is made. The flush runs the same few statements every time, so they are
        # prepared on the server (unless TALLY_DATABASE_PREPARED is off).
        if self._conn is not None and getattr(self._conn, "out_of_step", False):
            self._drop_connection()
        if self._conn is None or getattr(self._conn, "closed", False):
            self._conn = self.db.connect(busy_timeout_ms=self.busy_timeout_ms, prepared=True)
            self._replans.restart(REPLAN_FIRST)
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


def _parts(units: list[Accepted], events: int) -> list[list[Accepted]]:
    """The units in order, in consecutive parts of at most `events` events (a larger unit
    is a part of its own)."""
    parts: list[list[Accepted]] = []
    part: list[Accepted] = []
    size = 0
    for unit in units:
        if part and size + len(unit.events) > events:
            parts.append(part)
            part, size = [], 0
        part.append(unit)
        size += len(unit.events)
    if part:
        parts.append(part)
    return parts


def _split(units: list[Accepted]) -> tuple[list[Accepted], list[Accepted]] | None:
    """Two halves of a part (by units, then by the events of a lone unit); None for one event."""
    if len(units) > 1:
        middle = len(units) // 2
        return units[:middle], units[middle:]
    (unit,) = units
    if len(unit.events) == 1:
        return None
    middle = len(unit.events) // 2
    return [_sub_unit(unit, unit.events[:middle])], [_sub_unit(unit, unit.events[middle:])]


def _merged(pending: list[tuple[list[Accepted], str | None]]) -> list[tuple[list[Accepted], str | None]]:
    """The parts to store as one again, on top (in their order); those to set aside below."""
    aside = [entry for entry in pending if entry[1] is not None]
    parts = [entry[0] for entry in reversed(pending) if entry[1] is None]
    if not parts:
        return aside
    return [*aside, ([unit for part in parts for unit in part], None)]


def _sub_unit(unit: Accepted, events: list) -> Accepted:
    return unit._replace(events=events, counted=counted_events(events, unit.anonymous))


def _reason(exc: BaseException) -> str:
    cause = exc.__cause__ if isinstance(exc, StorageError) and exc.__cause__ else exc
    return f"{type(cause).__name__}: {cause}"
