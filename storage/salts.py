"""visitor_salts: the secret salt of each UTC day, shared by every worker and process."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import NamedTuple

import orjson

from storage.statements import statement


class Salt(NamedTuple):
    salt: bytes
    dated: bool  # its visitor ids carry the day (enrichment/visitor.py)


_READ_SALT = statement("SELECT salt, dated FROM visitor_salts WHERE day = ?")
# On PostgreSQL `day = ANY(?)` with the days as an array (storage.statements).
_READ_SALTS = statement(
    "SELECT day, salt, dated FROM visitor_salts WHERE day IN (SELECT value FROM json_each(?))")
_INSERT_SALT = statement(
    "INSERT OR IGNORE INTO visitor_salts (day, salt, created_at, dated) VALUES (?, ?, ?, 1)")
_DELETE_SALTS_BEFORE = statement("DELETE FROM visitor_salts WHERE day < ?")


def read_salt(conn: sqlite3.Connection, day: int) -> Salt | None:
    row = conn.execute(_READ_SALT, (day,)).fetchone()
    return Salt(row[0], row[1] == 1) if row else None


def read_salts(conn: sqlite3.Connection, days: Iterable[int]) -> dict[int, Salt]:
    """The stored salt of each of `days` that has one (a day without one is left out), in
    one statement: the flush reads every day its batch reaches back to in one round trip."""
    wanted = sorted(set(days))
    if not wanted:
        return {}
    return {day: Salt(salt, dated == 1) for day, salt, dated in
            conn.execute(_READ_SALTS, (orjson.dumps(wanted).decode(),))}


def insert_salt(conn: sqlite3.Connection, day: int, salt: bytes, created_at_ms: int) -> None:
    """Store the day's salt, dated, unless one is there already (the first writer wins)."""
    conn.execute(_INSERT_SALT,
                 (day, salt, created_at_ms))


def delete_salts_before(conn: sqlite3.Connection, day: int) -> None:
    conn.execute(_DELETE_SALTS_BEFORE, (day,))
