"""The events table and the one function that writes a flush into it.

`write_batch(conn, batch)` runs inside the flush transaction (BEGIN IMMEDIATE ... COMMIT,
opened by the flush thread): the events in their order, binding only the columns each
sets (storage.sparse: an executemany per run of rows setting the same columns), then the
monthly usage of every account in the batch, so the stored count always equals the
events stored.
Sessions and identity links (issue 6) are written first, in this same transaction, by
attribution.flush.assign_sessions, which fills each row's `row[SESSION_ID]` in place.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from attribution.flush import assign_sessions
from storage.sparse import SparseInsert

EVENT_COLUMNS = (
    "site_id", "ts", "name", "visitor_id", "pathname", "url", "hostname", "referrer",
    "referrer_host", "title", "width", "language", "uid", "props", "country", "browser", "os",
    "device", "utm_source", "utm_medium", "utm_campaign", "utm_term", "utm_content", "gclid",
    "gbraid", "wbraid", "msclkid", "fbclid", "session_id",
)
SITE_ID, TS, NAME, VISITOR_ID = 0, 1, 2, 3
UID = EVENT_COLUMNS.index("uid")
SESSION_ID = EVENT_COLUMNS.index("session_id")

_EVENTS = SparseInsert("events", EVENT_COLUMNS)  # columns with no DEFAULT: omitted = NULL
ADD_USAGE = (
    "INSERT INTO monthly_usage (account_id, month, events) VALUES (?, ?, ?)"
    " ON CONFLICT (account_id, month) DO UPDATE SET events = events + excluded.events"
    " RETURNING events"
)


@dataclass
class EventBatch:
    rows: list[list]  # EVENT_COLUMNS order
    usage: dict[tuple[int, str], int]  # (account id, month) -> counted events
    units: list = field(default_factory=list)  # the queue's Accepted units, in memory only
    usage_totals: dict[tuple[int, str], int] = field(default_factory=dict)  # set by the write


def write_batch(conn: sqlite3.Connection, batch: EventBatch) -> None:
    """Store a batch; the caller holds the transaction. Fills batch.usage_totals."""
    assign_sessions(conn, batch, EVENT_COLUMNS)  # sessions and $identify links (issue 6)
    _EVENTS.write(conn, batch.rows)
    for (account_id, month), events in batch.usage.items():
        total = conn.execute(ADD_USAGE, (account_id, month, events)).fetchone()[0]
        batch.usage_totals[(account_id, month)] = total
