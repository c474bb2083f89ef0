"""visitor_salts: the secret salt of each UTC day, shared by every worker and process."""

from __future__ import annotations

import sqlite3

from storage.statements import statement

_READ_SALT = statement("SELECT salt FROM visitor_salts WHERE day = ?")
_INSERT_SALT = statement(
    "INSERT OR IGNORE INTO visitor_salts (day, salt, created_at) VALUES (?, ?, ?)")
_DELETE_SALTS_BEFORE = statement("DELETE FROM visitor_salts WHERE day < ?")


def read_salt(conn: sqlite3.Connection, day: int) -> bytes | None:
    row = conn.execute(_READ_SALT, (day,)).fetchone()
    return row[0] if row else None


def insert_salt(conn: sqlite3.Connection, day: int, salt: bytes, created_at_ms: int) -> None:
    """Store the day's salt unless one is there already (the first writer wins)."""
    conn.execute(_INSERT_SALT,
                 (day, salt, created_at_ms))


def delete_salts_before(conn: sqlite3.Connection, day: int) -> None:
    conn.execute(_DELETE_SALTS_BEFORE, (day,))
