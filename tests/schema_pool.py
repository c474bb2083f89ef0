"""PostgreSQL schemas for tests, handed out again once emptied.

A new schema with Tally's tables costs the server about a fifth of a CPU second (CREATE
SCHEMA, the schema script, DROP SCHEMA ... CASCADE), and most tests use one. Each test
process keeps the schemas its tests gave back and hands them out again, emptied, exactly
as a new one would be:

- it is renamed first, so a connection a test left open (a leaked pool, a server not yet
  stopped) can no longer reach it by its old name, and the test that gets it next has a
  name no earlier test used;
- its tables are then locked, so no transaction a test left running can still be writing;
- it is reused only when its catalog matches what it was when made (tables, columns,
  defaults, constraints, indexes, triggers and whether they fire, functions, sequences'
  settings, rules, privileges, planner statistics) and `tally_schema_version` still holds
  the version schema.sql gives; a test that added a trigger or a function, altered a table,
  ran ANALYZE or changed the version leaves a schema that is dropped instead (the monthly
  partitions of events that Tally makes as it starts are dropped first: the schema was
  made without them);
- every table that holds rows is emptied (triggers and foreign keys off for that, as in
  pg_restore: every row of every table goes) and every sequence a test moved is set back to
  its start, not yet called, as CREATE left it; `tally_schema_version` keeps its one row.

A schema is also dropped once its tables have had many rows deleted (dead rows slow scans
down; the test server runs no autovacuum), and when the process ends.
"""

from __future__ import annotations

import uuid
from urllib.parse import quote

import psycopg
from psycopg import sql

# Rows deleted from one schema over its uses before it is dropped instead of emptied.
RETIRE_AFTER_ROWS = 20_000

# What a test can change in a schema besides its rows, one text line per object. Every
# object made in a schema depends on it in pg_depend (indexes, constraints, triggers and
# statistics on their table), so each catalog is read through its index, not scanned: the
# test server holds hundreds of schemas.
_CATALOG = """
WITH objects AS MATERIALIZED (
  SELECT d.classid, d.objid FROM pg_depend d
   WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = %(ns)s),
rels AS MATERIALIZED (
  SELECT c.* FROM pg_class c
   WHERE c.oid IN (SELECT objid FROM objects WHERE classid = 'pg_class'::regclass)
  UNION ALL
  SELECT c.* FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
   WHERE i.indrelid IN (SELECT objid FROM objects WHERE classid = 'pg_class'::regclass))
SELECT md5(coalesce(string_agg(replace(item, %(prefix)s, ''), E'\\n' ORDER BY item), ''))
  FROM (
  SELECT 'nsp ' || coalesce(n.nspacl::text, '') || ' ' || n.nspowner AS item
    FROM pg_namespace n WHERE n.oid = %(ns)s
  UNION ALL
  SELECT 'object ' || o.classid::regclass::text || ' ' || count(*)
    FROM objects o GROUP BY o.classid
  UNION ALL
  SELECT 'rel ' || c.relname || ' ' || c.relkind::text || c.relpersistence::text
         || c.relreplident::text || ' ' || c.relrowsecurity || c.relforcerowsecurity || ' '
         || c.relowner || ' ' || coalesce(c.relacl::text, '') || ' '
         || coalesce(c.reloptions::text, '')
    FROM rels c
  UNION ALL
  SELECT 'col ' || c.relname || '.' || a.attname || ' ' || a.attnum || ' '
         || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull || ' '
         || a.attidentity::text || a.attgenerated::text || ' ' || a.attcollation || ' '
         || a.attstattarget || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
    FROM rels c JOIN pg_attribute a ON a.attrelid = c.oid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
   WHERE a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT 'con ' || c.relname || ' ' || k.conname || ' ' || pg_get_constraintdef(k.oid) || ' '
         || k.condeferrable || k.condeferred || k.convalidated
    FROM rels c JOIN pg_constraint k ON k.conrelid = c.oid
  UNION ALL
  SELECT 'idx ' || pg_get_indexdef(i.indexrelid) || ' ' || i.indisvalid || i.indisclustered
    FROM rels c JOIN pg_index i ON i.indexrelid = c.oid
  UNION ALL
  SELECT 'trg ' || c.relname || ' ' || t.tgname || ' ' || t.tgenabled::text || ' '
         || CASE WHEN t.tgisinternal THEN 'internal' ELSE pg_get_triggerdef(t.oid) END
    FROM rels c JOIN pg_trigger t ON t.tgrelid = c.oid
  UNION ALL
  SELECT 'seq ' || c.relname || ' ' || s.seqtypid || ' ' || s.seqstart || ' '
         || s.seqincrement || ' ' || s.seqmax || ' ' || s.seqmin || ' ' || s.seqcache || ' '
         || s.seqcycle
    FROM rels c JOIN pg_sequence s ON s.seqrelid = c.oid
  UNION ALL
  SELECT 'rule ' || c.relname || ' ' || r.rulename || ' ' || r.ev_enabled::text
    FROM rels c JOIN pg_rewrite r ON r.ev_class = c.oid
  UNION ALL
  SELECT 'policy ' || c.relname || ' ' || p.polname
    FROM rels c JOIN pg_policy p ON p.polrelid = c.oid
  UNION ALL
  SELECT 'stat ' || c.relname || ' ' || s.staattnum
    FROM rels c JOIN pg_statistic s ON s.starelid = c.oid
  UNION ALL
  SELECT 'stat ext ' || c.relname || ' ' || x.stxname
    FROM rels c JOIN pg_statistic_ext x ON x.stxrelid = c.oid
  UNION ALL
  SELECT 'comment ' || c.relname || ' ' || d.objsubid || ' ' || md5(d.description)
    FROM rels c JOIN pg_description d ON d.objoid = c.oid AND d.classoid = 'pg_class'::regclass
  UNION ALL
  SELECT 'fn ' || p.oid::regprocedure::text || ' ' || p.prokind::text || ' '
         || CASE WHEN p.prokind = 'a' THEN ''
                 ELSE md5(replace(pg_get_functiondef(p.oid), %(prefix)s, '')) END
         || ' ' || coalesce(p.proacl::text, '') || ' ' || coalesce(p.proconfig::text, '')
    FROM pg_proc p WHERE p.oid IN (SELECT objid FROM objects WHERE classid = 'pg_proc'::regclass)
  UNION ALL
  SELECT 'type ' || t.typname || ' ' || t.typtype::text
    FROM pg_type t WHERE t.oid IN (SELECT objid FROM objects WHERE classid = 'pg_type'::regclass)
) items
"""


def schema_url(base: str, name: str) -> str:
    """The URL of `base` whose connections use the schema `name`."""
    separator = "&" if "?" in base else "?"
    return f"{base}{separator}options={quote(f'-csearch_path={name}')}"


class SchemaPool:
    """Schemas holding Tally's tables, for one test process (see the module doc)."""

    def __init__(self, base_url: str, connect_admin):
        self.base_url = base_url
        self._connect_admin = connect_admin
        self._admin: psycopg.Connection | None = None
        self._idle: list[str] = []
        self._made: dict[str, str] = {}  # a live schema's name -> its catalog as made
        self._deleted: dict[str, int] = {}  # rows deleted from it over its uses
        self._version: int | None = None

    def admin(self) -> psycopg.Connection:
        if self._admin is None or self._admin.closed or self._admin.broken:
            self._admin = self._connect_admin()
        return self._admin

    def take(self) -> str:
        """The URL of an empty schema holding Tally's tables, fresh or emptied."""
        name = self._idle.pop() if self._idle else self._make()
        return schema_url(self.base_url, name)

    def give_back(self, url: str) -> None:
        """Empty the schema and keep it for the next test, or drop it (module doc)."""
        name = url.rpartition("search_path%3D")[2]
        admin = self.admin()
        renamed = _new_name()
        try:
            admin.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(
                sql.Identifier(name), sql.Identifier(renamed)))
        except psycopg.Error:
            self._forget(name)
            self._drop(name)
            return
        self._made[renamed] = self._made.pop(name)
        self._deleted[renamed] = self._deleted.pop(name, 0)
        try:
            emptied = self._empty(renamed)
        except psycopg.Error:
            emptied = False
        if emptied and self._deleted[renamed] <= RETIRE_AFTER_ROWS:
            self._idle.append(renamed)
        else:
            self._forget(renamed)
            self._drop(renamed)

    def close(self) -> None:
        """Drop every schema kept; at the end of the test process."""
        for name in self._idle:
            self._drop(name)
        self._idle.clear()
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    # ---------------------------------------------------------------------------------
    def _make(self) -> str:
        from storage.migrations import postgres_version
        from storage.postgres import PostgresDatabase

        name = _new_name()
        admin = self.admin()
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        PostgresDatabase(schema_url(self.base_url, name)).connect().close()  # Tally's tables
        self._version = postgres_version()
        with admin.transaction():
            self._made[name] = self._catalog(admin, name)
        self._deleted[name] = 0
        return name

    def _empty(self, name: str) -> bool:
        """Whether the schema could be emptied as new; nothing is changed when not."""
        admin = self.admin()
        with admin.transaction():
            admin.execute("SET LOCAL lock_timeout = '10s'")
            tables = [row[0] for row in admin.execute(
                "SELECT c.relname FROM pg_class c WHERE c.relnamespace = %s::regnamespace"
                " AND c.relkind::text IN ('r', 'p') ORDER BY c.relname", (name,))]
            if tables:  # no transaction a test left running may still be writing
                admin.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                    sql.SQL(", ").join(sql.Identifier(name, t) for t in tables)))
            # The monthly partitions of events a test's app made (storage/events.py): a
            # new schema has only events_default.
            months = [row[0] for row in admin.execute(
                "SELECT c.relname FROM pg_class c WHERE c.relnamespace = %s::regnamespace"
                " AND c.relispartition AND c.relname ~ '^events_[0-9]{4}_[0-9]{2}$'", (name,))]
            for month in months:
                admin.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name, month)))
            tables = [t for t in tables if t not in months]
            if self._catalog(admin, name) != self._made[name] or self._version_rows(
                    admin, name) != [(self._version,)]:
                return False  # leaving the block rolls nothing back: nothing was changed
            filled = [t for t in tables if t != "tally_schema_version"]
            if filled:
                probe = sql.SQL(" UNION ALL ").join(
                    sql.SQL("SELECT {} WHERE EXISTS (SELECT 1 FROM {})").format(
                        sql.Literal(t), sql.Identifier(name, t)) for t in filled)
                filled = [row[0] for row in admin.execute(probe)]
            admin.execute("SET LOCAL session_replication_role = replica")
            for table in filled:
                cursor = admin.execute(sql.SQL("DELETE FROM {}").format(
                    sql.Identifier(name, table)))
                self._deleted[name] += cursor.rowcount
            admin.execute(
                "SELECT setval(s.seqrelid, s.seqstart, false) FROM pg_sequence s"
                " JOIN pg_class c ON c.oid = s.seqrelid"
                " WHERE c.relnamespace = %s::regnamespace"
                " AND pg_sequence_last_value(s.seqrelid) IS NOT NULL", (name,))
        return True

    @staticmethod
    def _catalog(admin: psycopg.Connection, name: str) -> str:
        # The schema on the path, and its name taken out of definitions that still spell it
        # (indexes, triggers, functions), so a renamed schema compares equal.
        admin.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(name)))
        oid = admin.execute("SELECT %s::regnamespace::oid", (name,)).fetchone()[0]
        return admin.execute(_CATALOG, {"ns": oid, "prefix": f"{name}."}).fetchone()[0]

    @staticmethod
    def _version_rows(admin: psycopg.Connection, name: str) -> list[tuple]:
        return admin.execute(sql.SQL("SELECT version FROM {}").format(
            sql.Identifier(name, "tally_schema_version"))).fetchall()

    def _forget(self, name: str) -> None:
        self._made.pop(name, None)
        self._deleted.pop(name, None)

    def _drop(self, name: str) -> None:
        admin = self.admin()
        admin.execute("SET lock_timeout = '10s'")
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
        admin.execute("RESET lock_timeout")


def _new_name() -> str:
    return f"tally_t_{uuid.uuid4().hex[:12]}"
