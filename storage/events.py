"""The events table: the shape of its row (`EventRow`) and the statement that inserts rows.

The flush (ingest/pipeline.py) builds EventRows, assigns their sessions, then calls
`insert_events` inside its transaction; the events go in in their order, binding only
the columns each sets (storage.sparse: an executemany per run of rows setting the same
columns).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

from storage.sparse import SparseInsert


class EventRow(NamedTuple):
    """One row of the events table before its session is known."""

    site_id: int
    ts: int  # unix ms
    name: str
    visitor_id: int | None
    pathname: str
    url: str
    hostname: str
    referrer: str | None
    referrer_host: str | None
    title: str | None
    width: int | None
    language: str | None
    uid: str | None
    props: str | None  # compact JSON text
    country: str | None
    browser: str | None
    os: str | None
    device: str | None
    # vocabulary.CAMPAIGN_PARAMS, in that order
    utm_source: str | None
    utm_medium: str | None
    utm_campaign: str | None
    utm_term: str | None
    utm_content: str | None
    gclid: str | None
    gbraid: str | None
    wbraid: str | None
    msclkid: str | None
    fbclid: str | None
    # 1 for an event of POST /api/v1/collect, None for a keyed one. The table keeps it
    # after session_id (version 16 added it): INSERT names the columns, so order is free.
    anonymous: int | None


# EventRow(*values) runs NamedTuple's generated __new__ in Python; the enrich step makes a
# row per event, so it builds each from the tuple of all its values in one C call.
new_event_row = partial(tuple.__new__, EventRow)

EVENT_COLUMNS = (*EventRow._fields, "session_id")
_EVENTS = SparseInsert("events", EVENT_COLUMNS)  # columns with no DEFAULT: omitted = NULL


def insert_events(conn: sqlite3.Connection, rows: Sequence[EventRow],
                  session_ids: Sequence[int | None]) -> None:
    """INSERT the rows, in order, each with its session id; the caller holds the transaction."""
    _EVENTS.write(conn, map(tuple.__add__, rows, [(session_id,) for session_id in session_ids]))
