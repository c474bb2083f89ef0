"""The events flush as one pipeline of named steps, each with a typed input:

    units: list[Accepted]                   (ingest.queue, one per request)
      enrich                -> EventBatch: rows: list[EventRow], usage, the rows that
                               reach back a day       (enrichment.enricher; no transaction)
      --- BEGIN IMMEDIATE ---
      browser visitors      -> script events (and their ip+ua's other events) under the
                               browser's visitor id   (enrichment.browser_ids)
      previous_visitor_ids  -> yesterday's visitor id per row  (enrichment.enricher)
      assign_sessions       -> a session id per row   (attribution.flush: sessions, visitor
                                                        links, $identify links)
      insert_events         -> events                 (storage.events)
      add_usage             -> monthly_usage totals   (storage.usage)
      --- COMMIT ---        then quota.usage.QuotaGuard.end_commit (ingest/flusher.py)

The flush thread (ingest/flusher.py) runs `enrich`, then `write_batch` inside one
transaction, so the events, their sessions and the usage they count are stored together
or not at all.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager

from attribution.flush import assign_sessions
from enrichment.browser_ids import BrowserVisitors
from enrichment.enricher import Enricher, EventBatch, previous_visitor_ids
from ingest.queue import Accepted
from storage.connection import Connection
from storage.events import insert_events
from storage.usage import add_usage


def enrich(enricher: Enricher, conn: Connection, units: list[Accepted]) -> EventBatch:
    with collector_paused():
        return enricher.build(conn, units)


def write_batch(conn: Connection, batch: EventBatch,
                browser_visitors: BrowserVisitors | None = None) -> None:
    """The steps after enrich, in the caller's transaction; fills batch.usage_totals."""
    with collector_paused():
        if browser_visitors is not None:
            browser_visitors.apply(conn, batch)  # before sessions: they follow visitors
        previous = previous_visitor_ids(conn, batch)
        session_ids = assign_sessions(conn, batch.rows, previous, batch.unlinked)
        insert_events(conn, batch.rows, session_ids)
        for key, (total, anonymous) in add_usage(conn, batch.usage,
                                                 batch.anonymous_usage).items():
            batch.usage_totals[key] = total
            batch.anonymous_totals[key] = anonymous


@contextmanager
def collector_paused():
    """The cyclic garbage collector waits while a step runs. A flush makes several objects
    an event, all freed by their reference counts, and the collector's passes over them
    cost 1-3 us an event (bench.flush_cost); it runs once the step is done."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
