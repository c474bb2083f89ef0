"""The attribution step of the events flush: sessions and identity links for a batch.

storage.events.write_batch calls `assign_sessions(conn, batch, EVENT_COLUMNS)` inside
the flush transaction, before its insert: it fills each row's session_id in place and
records sessions and $identify links, so events, sessions, links and first touches
commit (or roll back) together.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from operator import itemgetter

from attribution.sessions import IDENTIFY, SESSION_GAP_MS, UTM_KEYS, Hit, SessionWriter
from enrichment.visitor import DAY_MS, hashed_visitor_id, visitor_hasher
from validation.event import TS_FUTURE_MS

CLICK_ID_KEYS = ("gclid", "gbraid", "wbraid", "msclkid", "fbclid")
_HIT_COLUMNS = ("site_id", "visitor_id", "ts", "name", "url", "pathname", "referrer",
                "referrer_host")

_writer = SessionWriter()


def assign_sessions(conn: sqlite3.Connection, batch, columns: Sequence[str]) -> None:
    """batch: a storage.events.EventBatch (rows in `columns` order, units in memory)."""
    if not batch.rows:
        return
    at = {name: index for index, name in enumerate(columns)}
    head = itemgetter(*(at[name] for name in _HIT_COLUMNS))
    utm = itemgetter(*(at[key] for key in UTM_KEYS))
    click_columns = [(key, at[key]) for key in CLICK_ID_KEYS]
    clicks = itemgetter(*(index for _, index in click_columns))
    uid_column = at["uid"]
    previous = _previous_visitor_ids(conn, batch)
    hits = []
    for row, previous_visitor in zip(batch.rows, previous, strict=True):
        click_ids = ()
        if any(clicks(row)):
            click_ids = tuple(key for key, index in click_columns if row[index])
        hits.append(Hit(*head(row), utm(row), click_ids, row[uid_column], previous_visitor))
    session_column = at["session_id"]
    for row, session_id in zip(batch.rows, _writer.record(conn, hits), strict=True):
        row[session_column] = session_id


def _previous_visitor_ids(conn: sqlite3.Connection, batch) -> list[int | None]:
    """Each row's visitor id under the salt of the day before its receipt day, so a visit
    open at midnight UTC continues. None without ip/ua or when that salt is gone.

    An event that opens or continues a visit needs it only near the start of its receipt
    day. Every event stored under yesterday's id was received yesterday, so its `ts` is
    at most midnight plus the minute of clock skew the endpoint accepts (TS_FUTURE_MS);
    a visit that only yesterday's id reaches (one continued today is under today's id
    too) was last seen by then, so a later event, more than the session gap after it,
    finds nothing more under yesterday's id. `$identify` always gets it: it links its
    uid to yesterday's id whenever a visit of that id is open, even one also under
    today's id, and that link brings yesterday's earlier visits into first touch.
    """
    events = [(unit, event) for unit in batch.units for event in unit.events]
    if len(events) != len(batch.rows):  # rows not built from these units: no second look-up
        return [None] * len(batch.rows)
    salts: dict[int, bytes | None] = {}
    hashers: dict[tuple[int, int], object] = {}  # (day, site id) -> keyed hash, fed the site
    previous = []
    for unit, event in events:
        if event.ua is None or event.ip_packed is None or (
                event.ts > unit.day * DAY_MS + TS_FUTURE_MS + SESSION_GAP_MS
                and event.name != IDENTIFY):
            previous.append(None)
            continue
        day = unit.day - 1
        if (day, unit.site_id) not in hashers:
            if day not in salts:
                row = conn.execute("SELECT salt FROM visitor_salts WHERE day = ?",
                                   (day,)).fetchone()
                salts[day] = row[0] if row else None
            salt = salts[day]
            hashers[(day, unit.site_id)] = (None if salt is None
                                            else visitor_hasher(salt, unit.site_id))
        hasher = hashers[(day, unit.site_id)]
        previous.append(None if hasher is None
                        else hashed_visitor_id(hasher, event.ip_packed, event.ua))
    return previous
