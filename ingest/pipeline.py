"""The events flush as one pipeline of named steps, each with a typed input:

    units: list[Accepted]                   (ingest.queue, one per request)
      enrich                -> EventBatch: rows: list[EventRow], usage, the rows that
                               reach back a day       (enrichment.enricher; no transaction)
      decide (reads only; on SQLite before the lock, BatchWriter.prepare):
      browser visitors      -> script events (and their ip+ua's other events) under the
                               browser's visitor id   (enrichment.browser_ids)
      previous_visitor_ids  -> yesterday's visitor id per row  (enrichment.enricher)
      decide_sessions       -> a SessionPlan          (attribution.flush: sessions, visitor
                                                        links, $identify links)
      --- BEGIN IMMEDIATE --- (SQLite: the decisions' reads run again; decided again
                               when an answer changed)
      write_decided         -> browser links, new sessions with their final ids, then
      insert_events         -> events                 (storage.events), then
      write_session_changes -> stored sessions' changes, visitor and $identify links, and
      add_usage             -> monthly_usage totals   (storage.usage): on PostgreSQL
                               these go out in one pipeline, read back once
      --- COMMIT ---        then quota.usage.QuotaGuard.end_commit (ingest/flusher.py)

The flush thread (ingest/flusher.py) runs `enrich`, then (on SQLite) `BatchWriter.prepare`,
then the BatchWriter inside one transaction, so the events, their sessions and the usage
they count are stored together or not at all.
"""

from __future__ import annotations

import gc
from typing import NamedTuple

from attribution.flush import decide_sessions
from attribution.sessions import SessionPlan
from enrichment.browser_ids import BrowserVisitors
from enrichment.enricher import Enricher, EventBatch, previous_visitor_ids
from ingest.queue import Accepted
from storage.connection import Connection
from storage.dialect import pipelined
from storage.events import EventRow, insert_events, refuse_missing_sites
from storage.recorded import RecordedReads, recorded_reads
from storage.usage import add_usage


def enrich(enricher: Enricher, conn: Connection, units: list[Accepted]) -> EventBatch:
    with collector_paused():
        return enricher.build(conn, units)


class Decided(NamedTuple):
    """What write_decided writes for a batch: the browser links and the sessions' plan."""

    links: list[tuple]
    sessions: SessionPlan


def decide(conn: Connection, batch: EventBatch,
           browser_visitors: BrowserVisitors | None = None) -> Decided:
    """The steps' decisions, with reads only (batch.rows get their browser visitors)."""
    with collector_paused():
        links = browser_visitors.resolve(conn, batch) if browser_visitors is not None else []
        previous = previous_visitor_ids(conn, batch)
        return Decided(links, decide_sessions(conn, batch.rows, previous, batch.unlinked))


def write_decided(conn: Connection, batch: EventBatch, decided: Decided) -> None:
    """The writes of the steps, in the caller's transaction; fills batch.usage_totals."""
    with collector_paused():
        # On PostgreSQL the site check also takes the new sessions' ids: one round trip.
        session_ids = refuse_missing_sites(conn, batch.rows, decided.sessions.new_sessions)
        if decided.links:
            BrowserVisitors.write(conn, decided.links)
        insert_events(conn, batch.rows, write_sessions(conn, decided.sessions, session_ids))
        # After the COPYs (a COPY cannot be pipelined): the stored sessions' changes, the
        # links and the usage go out together and are read back once.
        with pipelined(conn):
            write_session_changes(conn, decided.sessions)
            totals = add_usage(conn, batch.usage, batch.anonymous_usage)
        for key, (total, anonymous) in totals().items():
            batch.usage_totals[key] = total
            batch.anonymous_totals[key] = anonymous


def write_sessions(conn: Connection, plan: SessionPlan,
                   final_ids: list[int] | None = None) -> list[int | None]:
    """The batch's new sessions (their final ids `final_ids` when taken already); each
    row's final session id."""
    return plan.write_sessions(conn, final_ids)


def write_session_changes(conn: Connection, plan: SessionPlan) -> None:
    """Stored sessions' changes, visitor links and identity links, after write_sessions."""
    plan.write_changes(conn)


def write_batch(conn: Connection, batch: EventBatch,
                browser_visitors: BrowserVisitors | None = None) -> None:
    """The steps after enrich, decided and written in the caller's transaction."""
    if browser_visitors is not None:
        browser_visitors.prune(conn)
    write_decided(conn, batch, decide(conn, batch, browser_visitors))


class Prepared(NamedTuple):
    """A batch decided before the write lock, and the reads the decisions rest on."""

    decided: Decided
    reads: RecordedReads
    rows: list[EventRow]  # batch.rows before decide() changed any


class BatchWriter:
    """write_batch for the flush thread (ingest/flusher.py), which on SQLite also calls
    prepare() before BEGIN IMMEDIATE: the batch is decided outside the write lock, where
    the other workers' flushes and payments need not wait for it. Under the lock the
    reads it rested on are run again; when any answer differs (another writer moved a
    session, linked a browser, made a salt in between) it is decided again there, so the
    decisions are always those of the data under the lock."""

    def __init__(self, browser_visitors: BrowserVisitors | None = None):
        self.browser_visitors = browser_visitors
        self.decided_again = 0  # prepared batches whose reads had changed under the lock

    def prepare(self, conn: Connection, batch: EventBatch) -> Prepared | None:
        """Decide the batch outside a transaction; None when that is not possible (the
        day's prune of browser links, a write, is due: the batch is then decided under
        the lock)."""
        browser_visitors = self.browser_visitors
        if browser_visitors is not None:
            if browser_visitors.prune_due():
                return None
            if any(unit.browser_id is not None for unit in batch.units):
                browser_visitors.ids.key(conn)  # made (written) once, before recording
        rows = list(batch.rows)
        with recorded_reads(conn) as reads:
            return Prepared(decide(reads, batch, browser_visitors), reads, rows)

    def __call__(self, conn: Connection, batch: EventBatch,
                 prepared: Prepared | None = None) -> None:
        if prepared is None:
            write_batch(conn, batch, self.browser_visitors)
        elif prepared.reads.unchanged(conn):
            write_decided(conn, batch, prepared.decided)
        else:
            self.decided_again += 1
            batch.rows[:] = prepared.rows
            write_batch(conn, batch, self.browser_visitors)


class collector_paused:  # noqa: N801 - used as a function: `with collector_paused():`
    """The cyclic garbage collector waits while a step runs. A flush makes several objects
    an event, all freed by their reference counts, and the collector's passes over them
    cost 1-3 us an event (bench.flush_cost); it runs once the step is done. A class rather
    than a generator: a flush enters it several times, and @contextmanager costs a few
    microseconds each time."""

    __slots__ = ("_paused",)

    def __enter__(self) -> None:
        self._paused = gc.isenabled()
        if self._paused:
            gc.disable()

    def __exit__(self, *exc) -> None:
        if self._paused:
            gc.enable()
