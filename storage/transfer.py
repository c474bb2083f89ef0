"""`tally migrate-to-postgres`: copy a SQLite database into an empty PostgreSQL one.

The source is read in one read transaction (a consistent state even while Tally serves,
though what it stores after the copy starts is not copied: stop Tally first). The target
is written in one transaction with COPY, so a failed copy leaves it as it was. Rows keep
their ids; each id sequence then continues after the largest id, and the events, copied
into events_default, move into their months' partitions. The first-touch triggers are held
off during the copy because customer_first_touch is copied as it is. The tables are
analyzed once the copy commits, so the first reports are planned for what they hold.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from storage.db import Database, StorageError
from storage.postgres import PostgresDatabase, analyze_schema, storage_error


class TransferError(StorageError):
    """The copy cannot be made (target not empty, source unreadable, counts differ)."""


@dataclass
class TransferResult:
    tables: dict[str, int] = field(default_factory=dict)  # table -> rows copied
    skipped: list[str] = field(default_factory=list)  # source tables the target lacks

    @property
    def rows(self) -> int:
        return sum(self.tables.values())


_TARGET_TABLES = (
    "SELECT c.relname FROM pg_class c WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition"
    " AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) AND c.relname <> 'tally_schema_version'"
)
# Each table's foreign-key parents within the schema, to copy parents first.
_PARENTS = (
    "SELECT child.relname, parent.relname FROM pg_constraint k"
    " JOIN pg_class child ON child.oid = k.conrelid JOIN pg_class parent ON parent.oid = k.confrelid"
    " WHERE k.contype = 'f' AND child.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())"
)
_COLUMNS = (
    "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
    " AND NOT attisdropped ORDER BY attnum"
)
# Columns numbered by a sequence of their own: identities, and events.id (a partitioned
# table can have no identity).
_IDENTITY_COLUMNS = (
    "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
    " AND NOT attisdropped AND pg_get_serial_sequence(%s, attname) IS NOT NULL"
)
# The copied events all went to events_default: each month of them gets its partition.
_EVENT_MONTHS = (
    "SELECT count(tally_events_month(month)) FROM (SELECT DISTINCT"
    " extract(epoch FROM date_trunc('month', to_timestamp(ts / 1000.0) AT TIME ZONE 'UTC'))"
    "::bigint * 1000 AS month FROM events_default) months"
)


def migrate_to_postgres(source: Database, target: PostgresDatabase) -> TransferResult:
    """Copy every row of `source` into `target`, whose tables must all be empty."""
    result = TransferResult()
    reader = sqlite3.connect(f"file:{source.path}?mode=ro", uri=True, isolation_level=None)
    try:
        writer = target.connect()
    except BaseException:
        reader.close()
        raise
    raw = writer.raw
    try:
        reader.execute("BEGIN")
        source_tables = {row[0] for row in reader.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
        with raw.transaction():
            target_tables = [row[0] for row in raw.execute(_TARGET_TABLES)]
            occupied = [t for t in target_tables if raw.execute(
                sql.SQL("SELECT 1 FROM {} LIMIT 1").format(sql.Identifier(t))).fetchone()]
            if occupied:
                raise TransferError(f"the target database is not empty ({', '.join(sorted(occupied))}"
                                    " hold rows); migrate into a new database")
            order = _parents_first(target_tables, raw.execute(_PARENTS).fetchall())
            for table in order:
                raw.execute(sql.SQL("ALTER TABLE {} DISABLE TRIGGER USER").format(sql.Identifier(table)))
            for table in order:
                if table not in source_tables:
                    continue
                result.tables[table] = _copy_table(reader, raw, table)
            for table in order:
                raw.execute(sql.SQL("ALTER TABLE {} ENABLE TRIGGER USER").format(sql.Identifier(table)))
                _continue_identities(raw, table)
            if "events" in result.tables:
                raw.execute(_EVENT_MONTHS)
            for table, copied in result.tables.items():
                stored = raw.execute(sql.SQL("SELECT count(*) FROM {}").format(
                    sql.Identifier(table))).fetchone()[0]
                if stored != copied:
                    raise TransferError(f"{table}: copied {copied} rows but {stored} are stored")
        result.skipped = sorted(source_tables - set(target_tables) - {"tally_schema_version"})
        analyze_schema(writer)
    except psycopg.Error as exc:
        raise storage_error(exc) from exc
    except sqlite3.Error as exc:
        raise TransferError(f"cannot read {source.path}: {exc}") from exc
    finally:
        reader.close()
        writer.close()
    return result


def _parents_first(tables: list[str], links: list[tuple[str, str]]) -> list[str]:
    parents = {table: set() for table in tables}
    for child, parent in links:
        if child != parent and child in parents and parent in parents:
            parents[child].add(parent)
    order: list[str] = []
    placed: set[str] = set()
    while len(order) < len(tables):
        ready = sorted(t for t in tables if t not in placed and parents[t] <= placed)
        if not ready:
            raise TransferError("the target schema's foreign keys form a cycle")
        order += ready
        placed.update(ready)
    return order


def _copy_table(reader: sqlite3.Connection, raw: psycopg.Connection, table: str) -> int:
    target_columns = [row[0] for row in raw.execute(_COLUMNS, (table,))]
    source_columns = {row[1] for row in reader.execute(f'PRAGMA table_info("{table}")')}  # sql-safe: a name from sqlite_master
    columns = [c for c in target_columns if c in source_columns]
    names = ", ".join(f'"{c}"' for c in columns)
    copied = 0
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns)))
    with raw.cursor().copy(statement) as copy:
        # sql-safe: the names come from both databases' catalogs
        for row in reader.execute(f'SELECT {names} FROM "{table}"'):  # noqa: S608
            copy.write_row(row)
            copied += 1
    return copied


def _continue_identities(raw: psycopg.Connection, table: str) -> None:
    quoted = sql.Identifier(table).as_string(raw)
    for (column,) in raw.execute(_IDENTITY_COLUMNS, (table, quoted)).fetchall():
        # The sequence continues after the largest id copied.
        raw.execute(sql.SQL("SELECT setval(pg_get_serial_sequence(%s, %s),"
                            " coalesce((SELECT max({}) FROM {}), 0) + 1, false)").format(
                                sql.Identifier(column), sql.Identifier(table)),
                    (sql.Identifier(table).as_string(raw), column))
