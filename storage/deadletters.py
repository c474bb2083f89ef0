"""Accepted events the flush could not store, set aside one by one with the reason.

The flush splits a failing batch until each failure is one event (ingest/flusher.py);
what still fails is written here, in its own transaction, so it never holds up another
event. The raw IP address is not kept, as it is never kept in the events table.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

import orjson

from storage.statements import statement

INSERT = statement(
    "INSERT INTO dead_letters (site_id, account_id, month, set_aside_at, reason, event)"
    " VALUES (?, ?, ?, ?, ?, ?)")
COUNT = statement("SELECT count(*) FROM dead_letters")
LIST = statement(
    "SELECT d.id, s.public_id, d.site_id, d.month, d.set_aside_at, d.reason, d.event"
    "  FROM dead_letters d LEFT JOIN sites s ON s.id = d.site_id"
    " ORDER BY d.id DESC LIMIT ?")
REASON_MAX_CHARS = 500


def event_json(event) -> str:
    """A validated event (validation.event.CleanEvent) as JSON, without its IP address."""
    fields = event._asdict()
    ip_packed, ua = fields.pop("ip_packed"), fields.pop("ua")
    fields["ip"] = None if ip_packed is None else "(not kept)"
    fields["ua"] = ua
    return orjson.dumps(fields).decode()


def set_aside(conn: sqlite3.Connection, letters: Iterable[tuple[int, int, str, str, str]],
              now_ms: int) -> None:
    """(site id, account id, month, reason, event JSON) each; the caller holds the transaction."""
    conn.executemany(INSERT, [(site, account, month, now_ms, reason[:REASON_MAX_CHARS], event)
                              for site, account, month, reason, event in letters])


def count(conn: sqlite3.Connection) -> int | None:
    """How many events are set aside; None on a database without the table."""
    try:
        return conn.execute(COUNT).fetchone()[0]
    except sqlite3.OperationalError:
        return None


def latest(conn: sqlite3.Connection, limit: int) -> list[dict]:
    return [
        {"id": row[0], "site": row[1] or row[2], "month": row[3], "set_aside_at": row[4],
         "reason": row[5], "event": orjson.loads(row[6])}
        for row in conn.execute(LIST, (limit,))
    ]
