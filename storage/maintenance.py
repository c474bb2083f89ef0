"""What an operator runs with `tally`: a consistent copy of a live database and its restore,
deleting raw traffic past the retention period, and erasing a customer's or a visitor's
personal data.

Each long delete goes in batches of BATCH rows, one short transaction each, so the flush
threads of a running server wait for the write lock at most one batch at a time.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson

from storage.browser_ids import browser_visitor_id, is_browser_id
from storage.db import Database, integrity_problems
from storage.dialect import counted_by_month, dialect
from storage.events import event_months, month_start
from storage.statements import by_dialect, native, statement
from vocabulary import TS_FUTURE_MS, TS_PAST_MS, UNCOUNTED_EVENTS

BATCH = 5_000


_JOURNAL_IN_ONE_FILE = native("sqlite", "PRAGMA journal_mode = DELETE")
_USER_VERSION = native("sqlite", "PRAGMA user_version")


_DELETE_EVENTS_OF_SITE = statement("DELETE FROM events WHERE site_id = ?")
_DELETE_SITE = statement("DELETE FROM sites WHERE id = ?")


class MaintenanceError(Exception):
    """The operation cannot be done as asked; the message says why."""


# Backups -------------------------------------------------------------------------------

@dataclass(frozen=True)
class BackupResult:
    path: str
    bytes: int
    user_version: int
    integrity: str


def backup(db: Database, destination: str) -> BackupResult:
    """A consistent copy of the live database, written beside the destination and renamed
    into place once checked; never overwrites. SQLite: a database file; PostgreSQL: a
    pg_dump archive of Tally's schema (see _backup_postgres)."""
    target_path = Path(destination)
    if target_path.exists():
        raise MaintenanceError(f"{destination} already exists; give a new file name")
    if not target_path.parent.is_dir():
        raise MaintenanceError(f"no folder {target_path.parent}")
    partial = target_path.with_name(target_path.name + ".partial")
    if dialect(db) == "postgres":
        version, integrity = _backup_postgres(db, partial)
    else:
        version, integrity = _backup_sqlite(db, partial)
    if integrity != "ok":
        partial.unlink(missing_ok=True)
        raise MaintenanceError(f"the copy failed its integrity check: {integrity}")
    with open(partial, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(partial, target_path)
    _fsync_folder(target_path.parent)
    return BackupResult(str(target_path), target_path.stat().st_size, version, integrity)


def _backup_sqlite(db: Database, partial: Path) -> tuple[int, str]:
    """SQLite's online backup API in one step: one read snapshot, so the copy is consistent
    while the server goes on writing (WAL readers block no writer)."""
    if not Path(db.path).is_file():
        raise MaintenanceError(f"no database at {db.path}")
    partial.unlink(missing_ok=True)
    source = sqlite3.connect(db.path, timeout=db.busy_timeout_ms / 1000)
    try:
        target = sqlite3.connect(partial)
        try:
            source.backup(target)  # pages=-1: the whole file within one read transaction
            # A backup is one self-contained file: no -wal beside it.
            target.execute(_JOURNAL_IN_ONE_FILE)
            problems = integrity_problems(target)
            integrity = "ok" if not problems else "; ".join(problems[:20])
            version = target.execute(_USER_VERSION).fetchone()[0]
        finally:
            target.close()
    finally:
        source.close()
    return version, integrity


_CURRENT_SCHEMA = native("postgres", "SELECT current_schema()")
# The tables that hold rows: a partitioned table's are its partitions'.
_SCHEMA_TABLES = native("postgres",
    "SELECT c.relname FROM pg_class c"
    " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'")


def _backup_postgres(db, partial: Path) -> tuple[int, str]:
    """pg_dump's custom-format archive of Tally's schema (the first of the URL's search_path),
    taken in one snapshot while the servers write, and read back with pg_restore --list:
    the copy is checked when the archive lists the data of every table. Restore with
    pg_restore (README, Backups)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    tools = {name: shutil.which(name) for name in ("pg_dump", "pg_restore")}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        raise MaintenanceError(
            f"{' and '.join(missing)} not found: install the PostgreSQL client programs"
            " (the server's major version or later) to back up a PostgreSQL database")
    if not db.exists():
        raise MaintenanceError(f"no database at {db.location}")
    from storage.postgres import schema_version

    conn = connection_as_is(db)  # as it is: a later release's database is copied, not refused
    try:
        schema_name = conn.execute(_CURRENT_SCHEMA).fetchone()[0]
        tables = {row[0] for row in conn.execute(_SCHEMA_TABLES)}
        version = schema_version(conn)
    finally:
        conn.close()
    # The password goes through the environment, never on a command line others can read.
    parameters = conninfo_to_dict(db.url)
    environment = dict(os.environ)
    if parameters.get("password") is not None:
        environment["PGPASSWORD"] = str(parameters.pop("password"))
    quoted_schema = '"' + schema_name.replace('"', '""') + '"'  # an exact name, not a pattern
    partial.unlink(missing_ok=True)
    dump = subprocess.run(
        [tools["pg_dump"], "--format=custom", f"--schema={quoted_schema}", "--no-password",
         f"--lock-wait-timeout={db.busy_timeout_ms}ms", f"--file={partial}",
         f"--dbname={make_conninfo(**parameters)}"],
        env=environment, capture_output=True, text=True, check=False)
    if dump.returncode != 0:
        partial.unlink(missing_ok=True)
        raise MaintenanceError(f"pg_dump failed: {_one_line(dump.stderr)}")
    listing = subprocess.run([tools["pg_restore"], "--list", str(partial)],
                             capture_output=True, text=True, check=False)
    if listing.returncode != 0:
        return version, f"pg_restore cannot read the archive: {_one_line(listing.stderr)}"
    dumped = {match.group(1) for match in re.finditer(
        rf"^\d+; \d+ \d+ TABLE DATA {re.escape(schema_name)} (\S+) ", listing.stdout, re.MULTILINE)}
    if tables - dumped:
        return version, f"the archive lacks the rows of {', '.join(sorted(tables - dumped))}"
    return version, "ok"


# Restores ------------------------------------------------------------------------------

SQLITE_HEADER = b"SQLite format 3\x00"
PG_DUMP_HEADER = b"PGDMP"


@dataclass(frozen=True)
class RestoreResult:
    source: str
    location: str
    user_version: int  # the backup's schema version, as restored (migrated at next open)


def restore(db: Database, source: str) -> RestoreResult:
    """Put the backup `source` (what `tally backup` wrote) in place of the database, which
    must not be there yet: a restore never overwrites. SQLite: a checked copy linked into
    place at TALLY_DB; PostgreSQL: pg_restore of the archive into the URL's schema, in
    one transaction. The restored database is left as the backup was, at its own schema
    version: Tally migrates it when it next opens it, as it does any older database."""
    path = Path(source)
    if not path.is_file():
        raise MaintenanceError(f"no backup at {source}")
    with open(path, "rb") as handle:
        header = handle.read(len(SQLITE_HEADER))
    archive, sqlite_file = header.startswith(PG_DUMP_HEADER), header == SQLITE_HEADER
    if dialect(db) == "postgres":
        if sqlite_file:
            raise MaintenanceError(f"{source} is a SQLite database: restore it with TALLY_DB set"
                                   " (and TALLY_DATABASE_URL unset), or copy it into PostgreSQL"
                                   " with tally migrate-to-postgres")
        if not archive:
            raise MaintenanceError(f"{source} is not a pg_dump archive: give a file tally"
                                   " backup wrote")
        return _restore_postgres(db, path)
    if archive:
        raise MaintenanceError(f"{source} is a PostgreSQL archive (pg_dump): restore it with"
                               " TALLY_DATABASE_URL set to the database to fill")
    if not sqlite_file:
        raise MaintenanceError(f"{source} is not a SQLite database: give a file tally backup"
                               " wrote")
    return _restore_sqlite(db, path)


def _restore_sqlite(db: Database, source: Path) -> RestoreResult:
    target = Path(db.path)
    present = [str(p) for p in (target, *(Path(f"{target}{suffix}") for suffix in
                                          ("-wal", "-shm", "-journal"))) if p.exists()]
    if present:
        raise MaintenanceError(
            f"{', '.join(present)} already there: a restore never overwrites; stop Tally and"
            f" move the database and its -wal and -shm files aside (README: Backups)")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        reader = sqlite3.connect(source)
        try:
            copy = sqlite3.connect(partial)
            try:
                reader.backup(copy)
                copy.execute(_JOURNAL_IN_ONE_FILE)  # one file, no -wal beside it
                problems = integrity_problems(copy)
                version = copy.execute(_USER_VERSION).fetchone()[0]
            finally:
                copy.close()
        finally:
            reader.close()
    except sqlite3.Error as exc:
        partial.unlink(missing_ok=True)
        raise MaintenanceError(f"{source} cannot be read as a database: {exc}") from exc
    if version > db.latest_version:
        partial.unlink(missing_ok=True)
        raise MaintenanceError(_too_new(source, version, db.latest_version))
    if problems:
        partial.unlink(missing_ok=True)
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise MaintenanceError(f"the backup {source} is damaged: {problems[0]}{more};"
                               " nothing was restored: restore an earlier backup")
    with open(partial, "rb") as handle:
        os.fsync(handle.fileno())
    try:
        os.link(partial, target)  # fails if a database appeared meanwhile: never replaced
    except FileExistsError:
        partial.unlink(missing_ok=True)
        raise MaintenanceError(f"{target} appeared during the restore; nothing was replaced") from None
    partial.unlink()
    _fsync_folder(target.parent)
    return RestoreResult(str(source), str(target), int(version))


_ARCHIVE_SCHEMA = re.compile(r"^\d+; \d+ \d+ SCHEMA - (\S+) ", re.MULTILINE)
_SCHEMA_COMMENT = re.compile(r"^\d+; \d+ \d+ COMMENT - SCHEMA (\S+) ", re.MULTILINE)
_SEARCH_PATH = native("postgres", "SELECT current_schema(), current_setting('search_path')")
_SCHEMA_EXISTS = native("postgres", "SELECT count(*) FROM pg_namespace WHERE nspname = ?")
_SCHEMA_OBJECTS = native("postgres",
    "SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    "         WHERE n.nspname = ?)"
    "     + (SELECT count(*) FROM pg_proc f JOIN pg_namespace n ON n.oid = f.pronamespace"
    "         WHERE n.nspname = ?)"
)


def _restore_postgres(db, source: Path) -> RestoreResult:
    """pg_restore of the archive in one transaction, into the URL's schema, which must be
    the archive's (pg_dump names it in every statement) and hold nothing yet."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from storage.postgres import analyze_schema, connect_as_is, schema_version

    tool = shutil.which("pg_restore")
    if tool is None:
        raise MaintenanceError("pg_restore not found: install the PostgreSQL client programs"
                               " (the server's major version or later) to restore an archive")
    listing = subprocess.run([tool, "--list", str(source)], capture_output=True, text=True,
                             check=False)
    if listing.returncode != 0:
        raise MaintenanceError(f"pg_restore cannot read {source}: {_one_line(listing.stderr)}")
    schemas = set(_ARCHIVE_SCHEMA.findall(listing.stdout))
    if len(schemas) != 1:
        raise MaintenanceError(f"{source} is not an archive of one schema (tally backup writes"
                               f" those); it holds {len(schemas)}")
    (schema_name,) = schemas
    version = _archive_version(tool, source)
    if version > db.latest_version:
        raise MaintenanceError(_too_new(source, version, db.latest_version))
    conn = connect_as_is(db.url, db.busy_timeout_ms)
    try:
        current, search_path = conn.execute(_SEARCH_PATH).fetchone()
        # current_schema() is the first schema of the search path that exists, if any.
        named = [part.strip().strip('"') for part in search_path.split(",")]
        writes_there = current == schema_name if current is not None else schema_name in named
        if not writes_there:
            raise MaintenanceError(
                f"the backup holds schema {schema_name} but TALLY_DATABASE_URL writes to"
                f" {current or search_path}: name it in the URL"
                f" (?options=-csearch_path%3D{schema_name}), in a new database (createdb)")
        exists = conn.execute(_SCHEMA_EXISTS, (schema_name,)).fetchone()[0] > 0
        objects = conn.execute(_SCHEMA_OBJECTS, (schema_name, schema_name)).fetchone()[0]
    finally:
        conn.close()
    if objects:
        raise MaintenanceError(
            f"schema {schema_name} of {db.location} already holds {objects} tables, sequences"
            " or functions: a restore never overwrites; restore into a new database (createdb)"
            " or an empty schema")
    entries = listing.stdout
    if exists:  # an empty schema already there (public, say): fill it, do not create it
        entries = _ARCHIVE_SCHEMA.sub(lambda m: ";" + m.group(0), entries)
        entries = _SCHEMA_COMMENT.sub(lambda m: ";" + m.group(0), entries)
    parameters = conninfo_to_dict(db.url)
    environment = dict(os.environ)
    if parameters.get("password") is not None:
        environment["PGPASSWORD"] = str(parameters.pop("password"))
    with tempfile.NamedTemporaryFile("w", suffix=".list") as chosen:
        chosen.write(entries)
        chosen.flush()
        result = subprocess.run(
            [tool, "--single-transaction", "--exit-on-error", "--no-owner", "--no-privileges",
             "--no-password", f"--use-list={chosen.name}", f"--dbname={make_conninfo(**parameters)}",
             str(source)],
            env=environment, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise MaintenanceError(f"pg_restore failed, nothing was restored: {_one_line(result.stderr)}")
    conn = connect_as_is(db.url, db.busy_timeout_ms)
    try:
        version = schema_version(conn)
        analyze_schema(conn)  # pg_restore leaves the tables unanalyzed
    finally:
        conn.close()
    return RestoreResult(str(source), db.location, version)


def _too_new(source, version: int, known: int) -> str:
    return (f"the backup {source} is at schema version {version}, newer than this release of"
            f" Tally knows ({known}): nothing was restored; restore it with the release that"
            f" made it or a later one")


# The one row of tally_schema_version as pg_restore writes its data: "24<TAB>t".
_ARCHIVE_VERSION = re.compile(r"^COPY \S+\.tally_schema_version \(version, one_row\) FROM stdin;\n(\d+)\t",
                              re.MULTILINE)


def _archive_version(tool: str, source: Path) -> int:
    """The schema version an archive of `tally backup` holds (0 when it holds none)."""
    data = subprocess.run([tool, "--data-only", "--table=tally_schema_version", "--file=-",
                           str(source)], capture_output=True, text=True, check=False)
    if data.returncode != 0:
        raise MaintenanceError(f"pg_restore cannot read {source}: {_one_line(data.stderr)}")
    found = _ARCHIVE_VERSION.search(data.stdout)
    return int(found.group(1)) if found else 0


def connection_as_is(db: Database):
    """A connection to the database as it is: no schema applied, nothing migrated (the
    checks of a restored backup, which an older release may be about to open)."""
    if dialect(db) == "postgres":
        from storage.postgres import connect_as_is

        return connect_as_is(db.url, db.busy_timeout_ms)
    return sqlite3.connect(f"{Path(db.path).resolve().as_uri()}?mode=ro", uri=True)


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())[:500] or "no message"


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Retention -----------------------------------------------------------------------------

_SITES_WITH_RAW = statement(
    "SELECT id FROM sites WHERE EXISTS (SELECT 1 FROM events WHERE site_id = sites.id AND ts < ?)"
    " OR EXISTS (SELECT 1 FROM sessions WHERE site_id = sites.id AND started_at < ?)"
)
_RAW_DAYS = statement(
    "SELECT DISTINCT ts / 86400000 FROM events WHERE site_id = ? AND ts < ?"
    " UNION SELECT DISTINCT started_at / 86400000 FROM sessions WHERE site_id = ? AND started_at < ?"
)
_STORED_DAY = statement(
    "SELECT (SELECT count(*) FROM traffic_days WHERE site_id = ? AND day = ?),"
    " (SELECT count(*) FROM traffic_day_dimensions WHERE site_id = ? AND day = ?)"
)
_OLD_EVENT_IDS = statement("SELECT id FROM events WHERE site_id = ? AND ts < ? LIMIT ?")
_DELETE_EVENTS = statement("DELETE FROM events WHERE id IN (SELECT value FROM json_each(?))")
# The counted events among those about to be deleted, as storage/check.py counts them.
_RECORD_DELETED = by_dialect(**{name: f"""
INSERT INTO deleted_events (account_id, month, events, early, late)
SELECT s.account_id, {counted_by_month(name)}
  FROM events e JOIN sites s ON s.id = e.site_id
 WHERE e.id IN (SELECT value FROM json_each(?)) AND (e.name <> ? OR e.anonymous = 1)
 GROUP BY s.account_id, month
 ON CONFLICT (account_id, month) DO UPDATE SET events = deleted_events.events + excluded.events,
    early = deleted_events.early + excluded.early, late = deleted_events.late + excluded.late
""" for name in ("sqlite", "postgres")})  # noqa: S608 - fixed fragments by dialect


def _delete_events(conn: sqlite3.Connection, ids: list[int]) -> int:
    """Delete events by id, keeping the count of the counted ones for `tally check`."""
    batch = orjson.dumps(ids).decode()
    conn.execute(_RECORD_DELETED[dialect(conn)], (TS_FUTURE_MS, TS_PAST_MS, batch, *UNCOUNTED_EVENTS))
    return conn.execute(_DELETE_EVENTS, (batch,)).rowcount


# A whole month of events (PostgreSQL, a partition), recorded as _RECORD_DELETED does.
_RECORD_DELETED_MONTH = native("postgres", f"""
INSERT INTO deleted_events (account_id, month, events, early, late)
SELECT s.account_id, {counted_by_month("postgres")}
  FROM events e JOIN sites s ON s.id = e.site_id
 WHERE e.ts >= ? AND e.ts < ? AND (e.name <> ? OR e.anonymous = 1)
 GROUP BY s.account_id, month
 ON CONFLICT (account_id, month) DO UPDATE SET events = deleted_events.events + excluded.events,
    early = deleted_events.early + excluded.early, late = deleted_events.late + excluded.late
""")  # noqa: S608 - a fixed fragment
_MONTH_EVENTS = native("postgres", "SELECT count(*) FROM events WHERE ts >= ? AND ts < ?")
_DROP_MONTH = native("postgres", "SELECT tally_drop_events_month(?)")


def drop_old_months(db: Database, before_ms: int) -> int:
    """Drop every monthly partition of events that ends by the cut-off, each in one
    transaction that first records its counted events; the number of events dropped.
    Rows of the month the cut-off falls in are left to delete_raw_traffic. SQLite: 0."""
    dropped = 0
    for month in event_months(db.conn()):
        end = month_start(month, 1)
        if end > before_ms:
            break
        with db.transaction() as conn:
            dropped += conn.execute(_MONTH_EVENTS, (month, end)).fetchone()[0]
            conn.execute(_RECORD_DELETED_MONTH,
                         (TS_FUTURE_MS, TS_PAST_MS, month, end, *UNCOUNTED_EVENTS))
            conn.execute(_DROP_MONTH, (month,))
    return dropped


# A session some customer's first touch points at is kept: revenue by channel reads it.
# One still being extended (seen after the cut-off) is kept too.
_OLD_SESSIONS = statement(
    "SELECT id FROM sessions WHERE site_id = ? AND started_at < ? AND last_seen_at < ?"
    " AND id NOT IN (SELECT session_id FROM customer_first_touch"
    "                 WHERE site_id = ? AND session_id IS NOT NULL)"
    " LIMIT ?"
)
_KEPT_SESSIONS = statement("SELECT count(*) FROM sessions WHERE site_id = ? AND started_at < ?")
_DELETE_SESSION_VISITORS = statement(
    "DELETE FROM session_visitors WHERE session_id IN (SELECT value FROM json_each(?))")
_DELETE_SESSIONS = statement("DELETE FROM sessions WHERE id IN (SELECT value FROM json_each(?))")


def sites_with_raw_traffic(db: Database, before_ms: int) -> list[int]:
    return [row[0] for row in db.conn().execute(_SITES_WITH_RAW, (before_ms, before_ms))]


def unstored_days(db: Database, site_id: int, before_ms: int, dimensions: int) -> list[int]:
    """Days with raw traffic before the cut-off whose figures are not all stored."""
    conn = db.conn()
    days = [row[0] for row in conn.execute(_RAW_DAYS, (site_id, before_ms, site_id, before_ms))]
    missing = []
    for day in sorted(days):
        totals, stored_dimensions = conn.execute(_STORED_DAY, (site_id, day, site_id, day)).fetchone()
        if totals != 1 or stored_dimensions != dimensions:
            missing.append(day)
    return missing


@dataclass(frozen=True)
class PruneResult:
    events: int
    sessions: int
    kept_sessions: int


def delete_raw_traffic(db: Database, site_id: int, before_ms: int) -> PruneResult:
    """Delete a site's events and sessions before the cut-off (not its first-touch sessions)."""
    events = sessions = 0
    while True:
        with db.transaction() as conn:
            ids = [row[0] for row in conn.execute(_OLD_EVENT_IDS, (site_id, before_ms, BATCH))]
            deleted = _delete_events(conn, ids)
        events += deleted
        if deleted < BATCH:
            break
    while True:
        with db.transaction() as conn:
            ids = [row[0] for row in conn.execute(
                _OLD_SESSIONS, (site_id, before_ms, before_ms, site_id, BATCH))]
            if ids:
                batch = orjson.dumps(ids).decode()
                conn.execute(_DELETE_SESSION_VISITORS, (batch,))
                conn.execute(_DELETE_SESSIONS, (batch,))
        sessions += len(ids)
        if len(ids) < BATCH:
            break
    kept = db.conn().execute(_KEPT_SESSIONS, (site_id, before_ms)).fetchone()[0]
    return PruneResult(events, sessions, kept)


# Erasure -------------------------------------------------------------------------------

_CUSTOMER = statement(
    "SELECT user_id, visitor_id FROM customers WHERE site_id = ? AND customer_id = ?")
_FIRST_TOUCH = statement(
    "SELECT session_id FROM customer_first_touch WHERE site_id = ? AND customer_id = ?")
# Setting user_id and visitor_id fires the trigger that recomputes the first touch (from no
# link: none); _KEEP_FIRST_TOUCH then puts back the one found before.
_ERASE_CUSTOMER = statement(
    "UPDATE customers SET email = NULL, name = NULL, metadata = NULL, user_id = NULL,"
    " visitor_id = NULL, updated_at = ? WHERE site_id = ? AND customer_id = ?"
)
_KEEP_FIRST_TOUCH = statement(
    "UPDATE customer_first_touch SET session_id = ? WHERE site_id = ? AND customer_id = ?"
)
_OTHER_CUSTOMER_WITH_USER = statement(
    "SELECT 1 FROM customers WHERE site_id = ? AND user_id = ? AND customer_id <> ? LIMIT 1"
)
_DELETE_IDENTITIES_OF_USER = statement(
    "DELETE FROM visitor_identities WHERE site_id = ? AND uid = ?")
_CLEAR_EVENT_UIDS = statement(
    "UPDATE events SET uid = NULL WHERE id IN"
    " (SELECT id FROM events WHERE site_id = ? AND uid = ? LIMIT ?)"
)


@dataclass(frozen=True)
class CustomerErasure:
    identities: int
    events: int


def erase_customer(db: Database, site_id: int, customer_id: str, now_ms: int) -> CustomerErasure | None:
    """Clear a customer's email, name, metadata, user id and visitor id, the $identify links
    of its user id and that user id on stored events. None when there is no such customer."""
    identities = 0
    with db.transaction() as conn:
        row = conn.execute(_CUSTOMER, (site_id, customer_id)).fetchone()
        if row is None:
            return None
        user_id = row[0]
        touch = conn.execute(_FIRST_TOUCH, (site_id, customer_id)).fetchone()
        conn.execute(_ERASE_CUSTOMER, (now_ms, site_id, customer_id))
        if touch is not None:
            conn.execute(_KEEP_FIRST_TOUCH, (touch[0], site_id, customer_id))
        shared = user_id is not None and conn.execute(
            _OTHER_CUSTOMER_WITH_USER, (site_id, user_id, customer_id)).fetchone()
        if user_id is not None and not shared:
            identities = conn.execute(_DELETE_IDENTITIES_OF_USER, (site_id, user_id)).rowcount
    events = 0
    while user_id is not None:
        with db.transaction() as conn:
            cleared = conn.execute(_CLEAR_EVENT_UIDS, (site_id, user_id, BATCH)).rowcount
        events += cleared
        if cleared < BATCH:
            break
    return CustomerErasure(identities, events)


_VISITOR_SESSIONS = statement(
    "SELECT session_id FROM session_links WHERE site_id = ? AND visitor_id = ?")
# A kept session's first visitor id, when it is another visitor's, stays linked as its
# other ids are (the session's visitor_id becomes 0).
_KEEP_OTHER_FIRST_VISITORS = statement(
    "INSERT INTO session_visitors (site_id, visitor_id, session_id)"
    " SELECT site_id, visitor_id, id FROM sessions WHERE id IN (SELECT value FROM json_each(?))"
    " AND visitor_id <> 0 AND visitor_id <> ? ON CONFLICT DO NOTHING")
_FIRST_TOUCH_SESSIONS = statement(
    "SELECT session_id FROM customer_first_touch WHERE site_id = ?"
    " AND session_id IN (SELECT value FROM json_each(?))"
)
_ANONYMIZE_SESSIONS = statement(
    "UPDATE sessions SET visitor_id = 0 WHERE id IN (SELECT value FROM json_each(?))")
_DELETE_VISITOR_LINKS = statement(
    "DELETE FROM session_visitors WHERE site_id = ? AND visitor_id = ?")
_DELETE_VISITOR_IDENTITIES = statement(
    "DELETE FROM visitor_identities WHERE site_id = ? AND visitor_id = ?")
# A browser visitor's links from the daily ip+ua ids it was seen under (and the reverse).
_DELETE_BROWSER_LINKS = statement(
    "DELETE FROM browser_links WHERE site_id = ? AND (visitor_id = ? OR daily_visitor_id = ?)"
)
_BROWSER_KEY = statement("SELECT key FROM browser_id_key WHERE id = 1")
_CUSTOMERS_OF_VISITOR = statement(
    "SELECT customer_id FROM customers WHERE site_id = ? AND visitor_id = ?")
_CLEAR_CUSTOMER_VISITOR = statement(
    "UPDATE customers SET visitor_id = NULL, updated_at = ? WHERE site_id = ? AND customer_id = ?"
)
# The visitor's events, and those of its deleted sessions under another visitor id (the
# same browser after midnight UTC, when the daily visitor id changes).
_VISITOR_EVENTS = statement(
    "SELECT id FROM events WHERE site_id = ? AND"
    " (visitor_id = ? OR session_id IN (SELECT value FROM json_each(?))) LIMIT ?"
)


@dataclass(frozen=True)
class VisitorErasure:
    events: int
    sessions: int
    anonymized_sessions: int
    identities: int
    customers: int


def erase_visitor(db: Database, site_id: int, visitor_id: int, now_ms: int) -> VisitorErasure:
    """Delete a visitor's events, sessions, identity links and customer links. A session
    that is a customer's first touch is kept without its visitor id (visitor_id 0), so that
    customer's revenue stays on the channel it came from."""
    with db.transaction() as conn:
        ids = sorted({row[0] for row in conn.execute(_VISITOR_SESSIONS, (site_id, visitor_id))})
        batch = orjson.dumps(ids).decode()
        kept = [row[0] for row in conn.execute(_FIRST_TOUCH_SESSIONS, (site_id, batch))]
        gone = orjson.dumps([i for i in ids if i not in set(kept)]).decode()
        customers = [row[0] for row in conn.execute(_CUSTOMERS_OF_VISITOR, (site_id, str(visitor_id)))]
        touches = {c: conn.execute(_FIRST_TOUCH, (site_id, c)).fetchone() for c in customers}
        for customer in customers:
            conn.execute(_CLEAR_CUSTOMER_VISITOR, (now_ms, site_id, customer))
            if touches[customer] is not None:
                conn.execute(_KEEP_FIRST_TOUCH, (touches[customer][0], site_id, customer))
        conn.execute(_DELETE_VISITOR_LINKS, (site_id, visitor_id))
        conn.execute(_DELETE_SESSION_VISITORS, (gone,))
        conn.execute(_DELETE_SESSIONS, (gone,))
        kept_batch = orjson.dumps(kept).decode()
        conn.execute(_KEEP_OTHER_FIRST_VISITORS, (kept_batch, visitor_id))
        conn.execute(_ANONYMIZE_SESSIONS, (kept_batch,))
        identities = conn.execute(_DELETE_VISITOR_IDENTITIES, (site_id, visitor_id)).rowcount
        conn.execute(_DELETE_BROWSER_LINKS, (site_id, visitor_id, visitor_id))
    events = 0
    while True:
        with db.transaction() as conn:
            event_ids = [row[0] for row in conn.execute(
                _VISITOR_EVENTS, (site_id, visitor_id, gone, BATCH))]
            deleted = _delete_events(conn, event_ids)
        events += deleted
        if deleted < BATCH:
            break
    return VisitorErasure(events, len(ids) - len(kept), len(kept), identities, len(customers))


def visitor_id_of(db: Database, site_id: int, given: str) -> int:
    """The stored visitor id: a signed 64-bit decimal as stored, or the tally_vid browser
    id of the tracking script (storage.browser_ids.is_browser_id), translated as the flush
    does."""
    if is_browser_id(given):
        row = db.conn().execute(_BROWSER_KEY).fetchone()
        if row is None:
            raise MaintenanceError("no browser visitor was ever stored, so no such visitor")
        return browser_visitor_id(row[0], site_id, given)
    try:
        visitor_id = int(given)
    except ValueError:
        raise MaintenanceError(f"--visitor must be a visitor id (signed 64-bit decimal) or a "
                               f"tally_vid browser id, not {given!r}") from None
    if not -(2**63) <= visitor_id < 2**63:
        raise MaintenanceError("--visitor is out of the 64-bit range")
    return visitor_id


# Removing a site -------------------------------------------------------------------------

_SITE_EVENT_IDS = statement("SELECT id FROM events WHERE site_id = ? LIMIT ?")
# Every table that holds a site's rows, children before the tables they reference;
# tests/test_onboarding.py fails when a table with a site_id column is missing here.
_SITE_TABLES = (
    "traffic_segment_values", "traffic_segment_days", "traffic_segment_dimensions",
    "traffic_segments", "traffic_day_values", "traffic_day_dimensions", "traffic_days",
    "customer_first_touch", "first_touch_refresh", "session_visitors", "visitor_identities",
    "browser_links", "sessions", "subscription_observations", "subscriptions", "payments",
    "customers", "stripe_objects", "stripe_events", "stripe_webhook_secrets", "shared_links",
    "api_keys", "site_identity_secrets", "dead_letters", "funnels", "site_hosts",
)
_DELETE_SITE_ROWS = {table: statement(f"DELETE FROM {table} WHERE site_id = ?")  # noqa: S608 - fixed names
                     for table in _SITE_TABLES}


def delete_site(db: Database, site_id: int) -> int:
    """Delete a site and everything stored for it; the number of its events deleted. Its
    counted events stay counted in the month's usage (deleted_events, as `tally prune`)."""
    events = 0
    while True:
        with db.transaction() as conn:
            ids = [row[0] for row in conn.execute(_SITE_EVENT_IDS, (site_id, BATCH))]
            deleted = _delete_events(conn, ids) if ids else 0
        events += deleted
        if deleted < BATCH:
            break
    with db.transaction() as conn:
        for table in _SITE_TABLES:
            conn.execute(_DELETE_SITE_ROWS[table], (site_id,))
        conn.execute(_DELETE_EVENTS_OF_SITE, (site_id,))
        conn.execute(_DELETE_SITE, (site_id,))
    return events
