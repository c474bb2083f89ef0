"""Bulk INSERT of rows that leave many columns NULL, binding only the columns each row sets.

Binding costs SQLite (through the sqlite3 module) about 0.18 us a column a row, NULL or
not, and a typical event or session leaves half of its columns NULL (UTM fields, click
ids, title, props...): an event of 29 columns with 12 set goes in in ~2 us instead of
~6 us when the statement names only those 12 (docs/perf-notes.md). A column left out of
an INSERT gets its DEFAULT, which is NULL unless the schema says otherwise: use
`SparseInsert` only where no column with another DEFAULT is ever given None.

Rows are written in their order: consecutive rows setting the same columns share one
executemany, so rowids follow the batch as one executemany of the full rows would.

On PostgreSQL the rows go in through one COPY of every column instead (a NULL costs it
nothing), in their order, so ids follow the batch there too (bench/postgres_insert.py).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from operator import is_not, itemgetter

from storage.dialect import dialect
from storage.statements import native

MAX_SHAPES = 256  # distinct column sets kept; more (never seen in practice) start over


class SparseInsert:
    def __init__(self, table: str, columns: Sequence[str]):
        self.table = table
        self.columns = tuple(columns)
        self._nones = (None,) * len(self.columns)
        self._shapes: dict[tuple[bool, ...], tuple[str, Callable]] = {}
        # The INSERT of every column, declared so the suite prepares it; each shape's
        # statement names a subset of its columns.
        native("sqlite", self._insert(range(len(self.columns))))

    def write(self, conn: sqlite3.Connection, rows: Iterable[Sequence]) -> None:
        """INSERT every row (a sequence in `columns` order), in order."""
        if dialect(conn) == "postgres":
            conn.copy_rows(self.table, self.columns, self._checked(rows))
            return
        nones, width = self._nones, len(self.columns)
        run: list = []
        statement = pick = None
        nulls = -1  # the NULLs of a row of the current shape
        for row in rows:
            if len(row) != width:
                raise ValueError(f"a row of {len(row)} values for {width} columns")
            if pick is not None:
                # The row has the current shape when the columns it binds are all set and
                # it has as many NULLs as that shape leaves out: two scans in C instead of
                # a comparison per column.
                values = pick(row)
                if None not in values and row.count(None) == nulls:
                    run.append(values)
                    continue
            if run:
                conn.executemany(statement, run)
                run = []
            sets = tuple(map(is_not, row, nones))
            statement, pick = self._statement(sets)
            nulls = sets.count(False) if any(sets) else -1
            run.append(pick(row))
        if run:
            conn.executemany(statement, run)

    def _checked(self, rows: Iterable[Sequence]) -> list[Sequence]:
        rows = rows if isinstance(rows, list) else list(rows)
        width = len(self.columns)
        for length in set(map(len, rows)) - {width}:  # in C: a Python step a row cost more
            raise ValueError(f"a row of {length} values for {width} columns")
        return rows

    def _insert(self, indexes) -> str:
        names = ", ".join(self.columns[i] for i in indexes)
        marks = ", ".join("?" * len(names.split(", ")))
        # Table and column names come from the callers' fixed tuples
        # (storage.events.EVENT_COLUMNS, attribution.sessions); values are parameters.
        return f"INSERT INTO {self.table} ({names}) VALUES ({marks})"  # noqa: S608 - fixed columns

    def _statement(self, sets: tuple[bool, ...]) -> tuple[str, Callable]:
        found = self._shapes.get(sets)
        if found is None:
            indexes = [i for i, is_set in enumerate(sets) if is_set] or [0]  # all NULL: bind one
            statement = self._insert(indexes)
            pick = itemgetter(*indexes)
            if len(indexes) == 1:
                index = indexes[0]
                pick = lambda row: (row[index],)  # noqa: E731 (itemgetter of one gives no tuple)
            if len(self._shapes) >= MAX_SHAPES:
                self._shapes.clear()
            found = self._shapes[sets] = (statement, pick)
        return found
