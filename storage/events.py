"""The events table: the shape of its row (`EventRow`), the statement that inserts rows,
and, on PostgreSQL, its monthly partitions.

The flush (ingest/pipeline.py) builds EventRows, assigns their sessions, then calls
`insert_events` inside its transaction; the events go in in their order, binding only
the columns each sets (storage.sparse: an executemany per run of rows setting the same
columns). On PostgreSQL events is partitioned by UTC month (schema_postgres.sql):
`make_event_months` makes the coming months' partitions, at start-up and as a background
duty (app.py), and `tally prune` drops whole months (storage/maintenance.py).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import NamedTuple

from storage.dialect import dialect
from storage.sessions import NEW_SESSION_IDS
from storage.sparse import SparseInsert
from storage.statements import native


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


class SiteNotStored(Exception):
    """Rows of a site that is no longer stored (removed while its events were queued)."""


_STORED_SITES = native("postgres", "SELECT id FROM sites WHERE id = ANY(?::bigint[])")
# The same check and the ids of the flush's new sessions (storage.sessions'
# NEW_SESSION_IDS, as final_session_ids takes them), in one statement: one round trip.
_STORED_SITES_AND_SESSION_IDS = native(
    "postgres", "SELECT ARRAY(SELECT id FROM sites WHERE id = ANY(?::bigint[])),"  # noqa: S608 - a declared statement
                " ARRAY(" + NEW_SESSION_IDS + ")")


def refuse_missing_sites(conn: sqlite3.Connection, rows: Collection[EventRow],
                         new_sessions: int = 0) -> list[int] | None:
    """Raise SiteNotStored unless the site of every row is stored. The flush calls it in
    its transaction, holding these sites' locks: on PostgreSQL events, sessions and their
    visitor links carry no foreign key to sites (schema_postgres.sql, "Checked by the
    flush"), so this one query stands for a check per row. SQLite's foreign keys check.

    On PostgreSQL the same statement takes the final ids of the batch's `new_sessions` new
    sessions, and they are returned (ascending, as storage.sessions.final_session_ids
    gives them); None on SQLite, or with no rows."""
    if dialect(conn) != "postgres" or not rows:
        return None
    wanted = {row.site_id for row in rows}
    if new_sessions:
        stored, session_ids = conn.execute(_STORED_SITES_AND_SESSION_IDS,
                                           (list(wanted), new_sessions)).fetchone()
    else:
        stored = [row[0] for row in conn.execute(_STORED_SITES, (list(wanted),))]
        session_ids = []
    missing = wanted.difference(stored)
    if missing:
        raise SiteNotStored(f"site {min(missing)} is not stored (removed)")
    return session_ids


def insert_events(conn: sqlite3.Connection, rows: Sequence[EventRow],
                  session_ids: Sequence[int | None]) -> None:
    """INSERT the rows, in order, each with its session id; the caller holds the transaction."""
    _EVENTS.write(conn, map(tuple.__add__, rows, [(session_id,) for session_id in session_ids]))


# Monthly partitions (PostgreSQL) ---------------------------------------------------------

# Months made ahead of the current one, so that a host whose duty stops for a while still
# writes into monthly partitions, never into events_default.
MONTHS_AHEAD = 3

_PARTITIONS = native(
    "postgres",
    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
    " WHERE i.inhparent = to_regclass('events')")
_MAKE_MONTH = native("postgres", "SELECT tally_events_month(?)")
_MONTH_NAME = re.compile(r"events_(\d{4})_(\d{2})")


def month_start(ms: int, later: int = 0) -> int:
    """The unix ms the UTC month holding `ms` starts at, or the month `later` months on."""
    when = datetime.fromtimestamp(ms / 1000, UTC)
    months = when.year * 12 + when.month - 1 + later
    return int(datetime(months // 12, months % 12 + 1, 1, tzinfo=UTC).timestamp()) * 1000


def event_months(conn) -> list[int]:
    """The first ms of each month that has its own partition, in order; none on SQLite."""
    if dialect(conn) != "postgres":
        return []
    found = (_MONTH_NAME.fullmatch(row[0]) for row in conn.execute(_PARTITIONS))
    return sorted(int(datetime(int(m[1]), int(m[2]), 1, tzinfo=UTC).timestamp()) * 1000
                  for m in found if m)


def make_event_months(db, now_ms: int, ahead: int = MONTHS_AHEAD) -> list[int]:
    """Make the partitions of this month and the next `ahead` ones that are missing (the
    first ms of each made). Idempotent across hosts: each month is made under the write
    lock, by whichever host comes first. Nothing to do on SQLite."""
    if db.dialect != "postgres":
        return []
    wanted = [month_start(now_ms, later) for later in range(ahead + 1)]
    missing = sorted(set(wanted) - set(event_months(db.conn())))
    if not missing:
        return []
    with db.transaction() as conn:
        return [month for month in missing if conn.execute(_MAKE_MONTH, (month,)).fetchone()[0]]
