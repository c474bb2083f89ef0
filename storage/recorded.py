"""Reads made before the write lock, kept so that they can be checked under it.

The SQLite flush decides a batch (sessions, browser visitors, yesterday's visitor ids)
before BEGIN IMMEDIATE, on a RecordedReads wrapping its connection, all in one read
transaction (`recorded_reads`): every statement the decision runs is a read, and its rows
are kept. Under the lock, `unchanged` first asks SQLite whether any other connection
committed since the decision's state (PRAGMA data_version, read on the same connection);
only then does it run each read again, and the same rows mean the decision is the one
the data under the lock gives.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from storage.statements import native


class _Rows:
    """The rows of one recorded statement, read as a cursor is."""

    __slots__ = ("_rows", "_next")

    def __init__(self, rows: list):
        self._rows = rows
        self._next = 0

    def __iter__(self) -> Iterator:
        rows, self._next = self._rows[self._next:], len(self._rows)
        return iter(rows)

    def fetchone(self):
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchall(self) -> list:
        rows, self._next = self._rows[self._next:], len(self._rows)
        return rows


class RecordedReads:
    """A connection for reads only, keeping each statement, its parameters and its rows."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn
        self._reads: list[tuple[str, Sequence, list]] = []
        self._version = _data_version(conn)

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction

    def execute(self, sql: str, parameters: Sequence = ()) -> _Rows:
        words = sql.split(None, 1)
        if not words or words[0].upper() not in ("SELECT", "WITH"):
            raise TypeError("a recorded decision only reads: " + sql)
        rows = self._conn.execute(sql, parameters).fetchall()
        self._reads.append((sql, parameters, rows))
        return _Rows(rows)

    def executemany(self, sql: str, parameters) -> None:
        raise TypeError("a recorded decision only reads: " + sql)

    def unchanged(self, conn: sqlite3.Connection) -> bool:
        """Whether every recorded read gives the same rows on `conn` now."""
        if conn is self._conn and _data_version(conn) == self._version:
            return True  # nothing committed by another connection since the reads
        return all(conn.execute(sql, parameters).fetchall() == rows
                   for sql, parameters, rows in self._reads)


@contextmanager
def recorded_reads(conn: sqlite3.Connection) -> Iterator[RecordedReads]:
    """A RecordedReads whose reads see one state of the database: they run in one read
    transaction, so SQLite takes and drops its file and WAL locks once for them all rather
    than once a statement (several system calls each, a fixed cost of every flush)."""
    begun = not conn.in_transaction
    if begun:
        conn.execute(_BEGIN)
    try:
        yield RecordedReads(conn)
    finally:
        if begun and conn.in_transaction:
            conn.execute(_COMMIT)


_DATA_VERSION = native("sqlite", "PRAGMA data_version")
_BEGIN = native("sqlite", "BEGIN")
_COMMIT = native("sqlite", "COMMIT")


def _data_version(conn: sqlite3.Connection) -> int:
    return conn.execute(_DATA_VERSION).fetchone()[0]
