"""The attribution step of the events flush: sessions and identity links for a batch.

storage.events.write_batch calls `assign_sessions(conn, batch, EVENT_COLUMNS)` inside
the flush transaction, before its insert: it fills each row's session_id in place and
records sessions and $identify links, so events, sessions, links and first touches
commit (or roll back) together.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from attribution.sessions import UTM_KEYS, Hit, SessionWriter
from enrichment.visitor import visitor_id

CLICK_ID_KEYS = ("gclid", "gbraid", "wbraid", "msclkid", "fbclid")

_writer = SessionWriter()


def assign_sessions(conn: sqlite3.Connection, batch, columns: Sequence[str]) -> None:
    """batch: a storage.events.EventBatch (rows in `columns` order, units in memory)."""
    if not batch.rows:
        return
    at = {name: index for index, name in enumerate(columns)}
    previous = _previous_visitor_ids(conn, batch)
    hits = []
    for row, previous_visitor in zip(batch.rows, previous, strict=True):
        hits.append(Hit(
            site_id=row[at["site_id"]],
            visitor_id=row[at["visitor_id"]],
            ts=row[at["ts"]],
            name=row[at["name"]],
            url=row[at["url"]],
            pathname=row[at["pathname"]],
            referrer=row[at["referrer"]],
            referrer_host=row[at["referrer_host"]],
            utm=tuple(row[at[key]] for key in UTM_KEYS),
            click_ids=tuple(key for key in CLICK_ID_KEYS if row[at[key]]),
            uid=row[at["uid"]],
            previous_visitor_id=previous_visitor,
        ))
    session_column = at["session_id"]
    for row, session_id in zip(batch.rows, _writer.record(conn, hits), strict=True):
        row[session_column] = session_id


def _previous_visitor_ids(conn: sqlite3.Connection, batch) -> list[int | None]:
    """Each row's visitor id under the salt of the day before its receipt day, so a visit
    open at midnight UTC continues. None without ip/ua or when that salt is gone."""
    events = [(unit, event) for unit in batch.units for event in unit.events]
    if len(events) != len(batch.rows):  # rows not built from these units: no second look-up
        return [None] * len(batch.rows)
    salts: dict[int, bytes | None] = {}
    previous = []
    for unit, event in events:
        if event.ua is None or event.ip_packed is None:
            previous.append(None)
            continue
        day = unit.day - 1
        if day not in salts:
            row = conn.execute("SELECT salt FROM visitor_salts WHERE day = ?", (day,)).fetchone()
            salts[day] = row[0] if row else None
        salt = salts[day]
        previous.append(None if salt is None else visitor_id(salt, unit.site_id,
                                                             event.ip_packed, event.ua))
    return previous
