"""PostgreSQL through psycopg 3, behind the same interface as storage.db.Database.

Storage's SQL is written once, in the subset SQLite and PostgreSQL share, with SQLite's
`?`/`?N` placeholders, and declared through storage.statements, which compiles each
statement's PostgreSQL spelling when it is declared. `PostgresConnection` gives the rest
of Tally the sqlite3 connection it already uses (execute, executemany, fetchone, rowcount,
in_transaction) and runs a declared statement's compiled spelling as is.

Writers of one site write in parallel with other sites' writers; every other writer is
serialized as SQLite serializes them. `BEGIN IMMEDIATE` takes one transaction-scoped
advisory lock exclusively; a site write (`transaction(sites=...)`: the flush, a payment)
takes it shared, plus a lock per site it writes, in site order. What the site writers
share needs no lock of theirs: session ids come from the sessions' sequence
(storage/sessions.py), monthly usage is added by an atomic upsert, and sessions, first
touches, customers and payments belong to one site. The payment writers take their sites'
locks shared, so the payment groups of one site (one writer a worker) run at once, and
serialize among themselves by locks of each payment, customer and subscription
(storage/payments.py lock_payments); the flush, which takes the site's lock exclusively,
still waits for them and they for it. Readers never take a lock. A lock or connection
failure surfaces as StorageBusy, a 503.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from contextlib import contextmanager
from decimal import Decimal
from importlib.resources import files
from urllib.parse import urlsplit

import orjson
import psycopg
from psycopg import errors as pg_errors
from psycopg import sql as pg_sql
from psycopg.adapt import Dumper, Loader
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg.types.numeric import Int8Dumper
from psycopg.types.string import StrDumper
from psycopg_pool import ConnectionPool, PoolTimeout

from storage import migrations
from storage.db import (
    BUSY_TIMEOUT_MS,
    READ_BUDGET_CHECK_STEPS,
    Budget,
    ReadBudgetExceeded,
    ReplicaLost,
    SchemaTooNew,
    StorageBusy,
    StorageError,
)
from storage.replica import MAX_LAG, PRIMARY_POSITION, Replica
from storage.statements import Statement, UnsupportedSQL, _ListText, native, translate

SCHEMA_PATH = files(__package__) / "schema_postgres.sql"

log = logging.getLogger("tally")

# Connections each process's pool may hold for request threads (Config.database_pool).
POOL_SIZE = 8
# Runs of a statement before a `prepared` connection prepares it (psycopg's threshold).
PREPARE_THRESHOLD = 2

# pg_advisory_xact_lock keys: one writer at a time, and one process applying the schema,
# each with the schema's hash as second key, so Tallys in two schemas of one database
# never wait for each other.
WRITE_LOCK_KEY = 0x7A11_0001
SCHEMA_LOCK_KEY = 0x7A11_0002
SITE_LOCK_KEY = 0x7A11_0003
_LOCK = "SELECT pg_advisory_xact_lock(%s::integer, hashtext(coalesce(current_schema(), '')))"
_SHARED_LOCK = ("SELECT pg_advisory_xact_lock_shared(%s::integer,"
                " hashtext(coalesce(current_schema(), '')))")
# One lock per site, taken in the order of the list (sorted: two writers never wait for
# each other in a cycle). Two (schema, site) pairs that share a key only wait needlessly.
_SITE_LOCKS = ("SELECT pg_advisory_xact_lock(%s::integer,"
               " hashtext(coalesce(current_schema(), '')) # s::integer)"
               " FROM unnest(%s::bigint[]) WITH ORDINALITY AS u (s, n) ORDER BY n")
# The same locks shared: for the payment writers, which serialize what they share by locks
# of their own (storage/payments.py), and which the flush and the sites' other writers
# (exclusive) still exclude. A shared request waits behind an exclusive one already
# waiting, so a stream of payment groups never starves the flush.
_SHARED_SITE_LOCKS = _SITE_LOCKS.replace("pg_advisory_xact_lock(", "pg_advisory_xact_lock_shared(")
# Applying the schema waits longer than a request would for the write lock: another host
# starting at the same time holds it for as long as the script runs.
SCHEMA_LOCK_TIMEOUT_MS = 60_000

# PostgreSQL text cannot hold U+0000, which Tally stores as sent. Strings carrying it are
# written with NUL as ESCAPE + "0" and ESCAPE itself doubled (ESCAPE is a private-use
# character), and read back unescaped, so a round trip is exact.
_ESCAPE = "\ue000"
_NUL = "\x00"


def _escape_text(text: str) -> str:
    return text.replace(_ESCAPE, _ESCAPE + _ESCAPE).replace(_NUL, _ESCAPE + "0")


def _unescape_text(text: str) -> str:
    return re.sub("\ue000(.)", lambda m: _NUL if m.group(1) == "0" else m.group(1), text,
                  flags=re.DOTALL)


# A NUL and ESCAPE as orjson writes them, each after a byte that starts it: a search for
# one byte is a memchr, several times faster than one for the whole sequence, and the
# first bytes are rare in what Tally stores (a backslash only escapes a quote or a control
# character, 0xEE starts only U+E000-U+EFFF).
_ENCODED_ESCAPES = ((b"\\", b"\\u0000"), (_ESCAPE.encode()[:1], _ESCAPE.encode()))


def _needs_escapes(rows: list[Sequence]) -> bool:
    """Whether a string of the rows holds NUL or ESCAPE (or the rows are not plain JSON
    values, so that this cannot tell): one pass in C over them all."""
    try:
        text = orjson.dumps(rows)
    except TypeError:
        return True
    return any(first in text and escape in text for first, escape in _ENCODED_ESCAPES)


class _TextDumper(Dumper):
    # oid 0 ("unknown"): PostgreSQL gives the value the type its context needs, as SQLite's
    # untyped parameters behave (a str into a BIGINT column or compared with one).
    oid = 0

    def dump(self, obj: str) -> bytes:
        if _NUL in obj or _ESCAPE in obj:
            obj = _escape_text(obj)
        return obj.encode()


class _TextLoader(Loader):
    def load(self, data) -> str:
        text = bytes(data).decode()
        return _unescape_text(text) if _ESCAPE in text else text


class _TypedTextDumper(_TextDumper):
    oid = psycopg.adapters.types["text"].oid


class _BoolAsIntDumper(Int8Dumper):
    # Flags are 0/1 integers in both schemas; SQLite stores a Python bool as one.
    def dump(self, obj: bool) -> bytes:
        return b"1" if obj else b"0"


class _BoolAsIntLoader(Loader):
    # A comparison selected as a value (`x IS NULL`) is 0/1 in SQLite; the same here.
    def load(self, data) -> int:
        return 1 if bytes(data) == b"t" else 0


class _NumericLoader(Loader):
    # sum() of BIGINT is NUMERIC here and an integer in SQLite: load whole numbers as int.
    def load(self, data):
        text = bytes(data).decode()
        if "." in text or "e" in text or "N" in text:
            return float(Decimal(text))
        return int(text)


def _adapt(context) -> None:
    adapters = context.adapters
    adapters.register_dumper(int, Int8Dumper)
    adapters.register_dumper(bool, _BoolAsIntDumper)
    adapters.register_dumper(str, _TextDumper)
    adapters.register_dumper(_ListText, _TypedTextDumper)
    adapters.register_loader("text", _TextLoader)
    adapters.register_loader("varchar", _TextLoader)
    adapters.register_loader("bool", _BoolAsIntLoader)
    adapters.register_loader("numeric", _NumericLoader)


_SIZE = native(
    "postgres",
    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
    " WHERE c.relkind = 'r' AND c.relnamespace ="
    " (SELECT oid FROM pg_namespace WHERE nspname = current_schema())")


# The first word of a statement that only reads (a WITH that writes names INSERT, UPDATE or
# DELETE after it).
_READS = re.compile(r"\s*(SELECT|SHOW|VALUES|TABLE|WITH)\b", re.IGNORECASE)
_WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE|MERGE)\b", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def _reads_only(sql: str) -> bool:
    found = _READS.match(sql)
    return found is not None and (found[1].upper() != "WITH" or _WRITES.search(sql) is None)


def _compiled(sql: str):
    """A declared statement's PostgreSQL spelling, compiled when it was declared; any other
    text (the suite's own statements) is compiled once and cached, by the same compiler."""
    if isinstance(sql, Statement):
        if sql.postgres is None:
            raise UnsupportedSQL(f"a statement for SQLite only, run on PostgreSQL: {sql[:200]}")
        return sql.postgres
    return translate(sql)


# --- errors ---------------------------------------------------------------------------------

# A lock or connection failure (other sessions, the network, a server restarting): StorageBusy,
# a 503, as SQLite's busy and locked are.
_BUSY = (
    pg_errors.LockNotAvailable, pg_errors.DeadlockDetected, pg_errors.SerializationFailure,
    pg_errors.QueryCanceled, pg_errors.AdminShutdown, pg_errors.CrashShutdown,
    pg_errors.CannotConnectNow, pg_errors.TooManyConnections,
)
# The server's resources: a retry can succeed once they are back, so the flush keeps the
# batch, but a request is answered 500, as SQLite's full disk is (StorageError).
_RESOURCES = (
    pg_errors.DiskFull, pg_errors.OutOfMemory, pg_errors.InsufficientResources,
    pg_errors.IoError, pg_errors.ReadOnlySqlTransaction,
)


def is_busy(exc: BaseException) -> bool:
    if isinstance(exc, _BUSY):
        return True
    # Connection-level failures (refused, reset, server gone) carry no SQLSTATE.
    return isinstance(exc, psycopg.OperationalError) and getattr(exc, "sqlstate", None) in (
        None, "08000", "08003", "08006", "08001", "08004", "57P01", "57P02", "57P03")


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same write can succeed: constraint, data and syntax errors fail again."""
    return is_busy(exc) or isinstance(exc, _RESOURCES)


def one_line(exc: BaseException) -> str:
    """libpq's messages span lines ("...\n\tIs the server running"): one line for logs."""
    return " ".join(str(exc).split())


def storage_error(exc: psycopg.Error) -> StorageError:
    return StorageBusy(one_line(exc)) if is_busy(exc) else StorageError(one_line(exc))


# --- connections ----------------------------------------------------------------------------

class PostgresCursor:
    """The part of sqlite3.Cursor storage uses."""

    __slots__ = ("_cursor", "_pipeline")

    def __init__(self, cursor: psycopg.Cursor, pipeline: psycopg.Pipeline | None = None):
        self._cursor = cursor
        self._pipeline = pipeline  # the pipeline the statement was sent in, if any

    def fetchone(self):
        return self._cursor.fetchone() if self.description else None

    def fetchall(self) -> list:
        return self._cursor.fetchall() if self.description else []

    def fetchmany(self, size: int) -> list:
        return self._cursor.fetchmany(size) if self.description else []

    def __iter__(self):
        return iter(self._cursor) if self.description else iter(())

    @property
    def rowcount(self) -> int:
        self._arrived()
        return self._cursor.rowcount

    @property
    def description(self):
        self._arrived()
        return self._cursor.description

    def _arrived(self) -> None:
        """In a pipeline, waits for the results sent so far (this statement's among them)."""
        if self._pipeline is not None and self._pipeline.status != PipelineStatus.OFF:
            self._pipeline.sync()
            self._pipeline = None


class PostgresConnection:
    """A psycopg connection that takes storage's statements as a sqlite3 connection does."""

    dialect = "postgres"

    def __init__(self, raw: psycopg.Connection, lock_timeout_ms: int, *, replica: bool = False,
                 settings: tuple[tuple[str, str], ...] = ()):
        """`settings`: (name, value) pairs every transaction this connection opens sets
        for itself (SET LOCAL), besides lock_timeout."""
        self.raw = raw
        self.lock_timeout_ms = lock_timeout_ms
        self.lock_wait_ms = lock_timeout_ms  # the lock_timeout of the transactions it opens
        self.replica = replica  # a connection to the read replica (storage/replica.py)
        self.settings = settings
        self.budget: Budget | None = None  # a read budget's deadline (PostgresDatabase.read_budget)
        self._statement_timeout_ms = 0  # the open transaction's statement_timeout (0: none set)
        self._reading = False  # a read budget's own transaction is open (_within_budget)
        self.pipelined: psycopg.Pipeline | None = None  # inside pipeline(): its pipeline
        self.out_of_step = False  # stop_preparing() was called: its owner replaces it

    def stop_preparing(self) -> None:
        """After a pipeline that failed part way. The server skips every statement after an
        error up to the next Sync, including the PREPARE of a statement run for the
        threshold's time, but psycopg (3.3.9) still names that statement as prepared, so
        the next run of it fails ("prepared statement ... does not exist"): the payment
        after a refused one, or after a full disk had space again, answered 500. From
        here this connection prepares nothing and uses nothing it prepared; its owner
        replaces it (`out_of_step`) to prepare again on a new one."""
        if self.raw.prepare_threshold is not None:
            self.raw.prepare_threshold = None
            self.out_of_step = True

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction of the caller's is open (not a read budget's own)."""
        return (self.raw.info.transaction_status != TransactionStatus.IDLE
                and not self._reading)

    @property
    def closed(self) -> bool:
        return self.raw.closed or self.raw.broken

    def execute(self, sql: str, params=()) -> PostgresCursor:
        keyword = sql.lstrip()[:16].upper()
        if keyword.startswith("BEGIN"):
            return self._begin(immediate="IMMEDIATE" in sql.upper())
        if keyword.startswith("PRAGMA"):
            return self._pragma(sql)
        statement = _compiled(sql)
        cursor = psycopg.RawCursor(self.raw)
        if self.budget is not None and not self._within_budget(statement.raw):
            return self._alone(lambda: cursor.execute(statement.raw,
                                                      statement.arguments(params) or ()), cursor)
        try:
            cursor.execute(statement.raw, statement.arguments(params) or ())
        except psycopg.Error as exc:
            self._end_reading(failed=True)
            if isinstance(exc, pg_errors.QueryCanceled):
                raise self._canceled(exc) from exc
            raise
        return PostgresCursor(cursor, self.pipelined)

    def executemany(self, sql: str, rows) -> PostgresCursor:
        statement = _compiled(sql)
        cursor = self.raw.cursor()

        def run() -> None:
            if statement.order is None and not statement.lists and not statement.null_tests:
                cursor.executemany(statement.text, rows)
            else:
                cursor.executemany(statement.text, (statement.arguments(row) for row in rows))
        if self.budget is not None and not self._within_budget(None):
            return self._alone(run, cursor)
        try:
            run()
        except pg_errors.QueryCanceled as exc:
            raise self._canceled(exc) from exc
        return PostgresCursor(cursor)

    # A read budget: the server stops a statement at statement_timeout, and no statement
    # starts once the deadline has passed. The timeout is set for one transaction only (SET
    # LOCAL), so it never outlives the read on the server connection, which a pooler in
    # transaction mode (PgBouncer) may hand to another client next. Reads outside the
    # caller's transactions run in one transaction the budget opens at its first statement
    # and ends with it (READ COMMITTED: each statement sees what is committed when it
    # starts, as without it); a write there runs in a transaction of its own. The timeout
    # is the time left, tightened as it shrinks (at most a tenth over it, and a SET only
    # every tenth of the time left).
    def start_budget(self, budget: Budget) -> None:
        self.budget = budget
        self._statement_timeout_ms = 0
        self._within_budget("")

    def end_budget(self) -> None:
        """The budget's transaction ended, and a transaction of the caller's the stop may
        have cut short rolled back (statement_timeout goes with them); a connection that
        cannot is closed (the pool replaces it)."""
        self.budget = None
        if self.closed:
            self._reading, self._statement_timeout_ms = False, 0
            return
        try:
            if self._reading:
                self._end_reading()
            elif self.in_transaction:
                self.raw.execute("ROLLBACK")
        except psycopg.Error:
            self.raw.close()
        self._statement_timeout_ms = 0

    def _end_reading(self, *, failed: bool = False) -> None:
        """End the budget's own transaction, if open: COMMIT, or ROLLBACK after a failed
        statement (it read only)."""
        if not self._reading:
            return
        self._reading, self._statement_timeout_ms = False, 0
        if self.closed:
            return
        try:
            self.raw.execute("ROLLBACK" if failed else "COMMIT", prepare=False)
        except psycopg.Error:
            self.raw.close()
            if not failed:
                raise

    def _left_ms(self) -> float:
        budget = self.budget
        left_ms = budget.remaining() * 1000
        if left_ms <= 0:
            budget.tripped = True
            raise ReadBudgetExceeded(budget.seconds)
        return left_ms

    def _within_budget(self, sql: str | None) -> bool:
        """Before a statement under the budget (`sql`: its text; "": none yet, None: a
        write): raises past the deadline. False: the statement must run in a transaction
        of its own (_alone). Otherwise it runs in the caller's transaction or the budget's,
        opened here, whose timeout is the time left."""
        left_ms = self._left_ms()
        if not self.in_transaction:
            if sql is None or (sql and not _reads_only(sql)):
                self._end_reading()
                return False
            if not self._reading:
                if sql:
                    self.raw.execute(f"BEGIN; {self._settings_sql()}", prepare=False)
                    self._reading = True
                return True
        if not self._statement_timeout_ms or left_ms < 0.9 * self._statement_timeout_ms:
            timeout = max(1, math.ceil(left_ms))
            try:
                self.raw.execute(f"SET LOCAL statement_timeout = {timeout}")  # sql-safe: an int
            except psycopg.Error as exc:
                self._end_reading(failed=True)
                if isinstance(exc, pg_errors.QueryCanceled):
                    raise self._canceled(exc) from exc
                raise
            self._statement_timeout_ms = timeout
        return True

    def _alone(self, run: Callable[[], None], cursor) -> PostgresCursor:
        """`run()` (a statement on `cursor`) in a transaction of its own with this
        connection's settings and the budget's time left: one round trip."""
        try:
            with self.raw.pipeline():
                self.raw.execute("BEGIN", prepare=False)
                self.raw.execute(self._settings_sql(), prepare=False)
                run()
                self.raw.execute("COMMIT", prepare=False)
        except BaseException as exc:
            self._statement_timeout_ms = 0
            if not self.closed and self.raw.info.transaction_status != TransactionStatus.IDLE:
                try:
                    self.raw.execute("ROLLBACK")
                except psycopg.Error:
                    self.raw.close()
            if isinstance(exc, pg_errors.QueryCanceled):
                raise self._canceled(exc) from exc
            raise
        self._statement_timeout_ms = 0
        return PostgresCursor(cursor)

    def _settings_sql(self) -> str:
        """One statement that sets, for the transaction just begun, its lock_timeout, the
        connection's settings and, under a read budget, statement_timeout (the time left)."""
        pairs = [("lock_timeout", str(int(self.lock_wait_ms))), *self.settings]
        self._statement_timeout_ms = 0
        if self.budget is not None:
            self._statement_timeout_ms = max(1, math.ceil(self._left_ms()))
            pairs.append(("statement_timeout", str(self._statement_timeout_ms)))
        return "SELECT " + ", ".join(f"set_config('{name}', '{value}', true)"
                                     for name, value in pairs)

    def begin(self, begin: str = "BEGIN") -> None:
        """`begin` (a BEGIN statement) and the transaction's settings, in one round trip
        (the budget's own transaction ended first)."""
        settings = self._settings_sql()
        end = "COMMIT; " if self._reading else ""
        self._reading = False
        self.raw.execute(f"{end}{begin}; {settings}", prepare=False)

    def _canceled(self, exc: pg_errors.QueryCanceled) -> Exception:
        """A statement the server canceled: under a budget, the budget stopped it."""
        if self.budget is None:
            return exc
        self.budget.tripped = True
        return ReadBudgetExceeded(self.budget.seconds)

    def copy_rows(self, table: str, columns: Sequence[str], rows: Iterable[Sequence]) -> None:
        """COPY the rows, each in `columns` order, into `table`, in their order. Many rows
        go in several times faster than through executemany, and for a tenth of the CPU
        on either side (bench/postgres_insert.py)."""
        statement = pg_sql.SQL("COPY {} ({}) FROM STDIN").format(
            pg_sql.Identifier(table), pg_sql.SQL(", ").join(map(pg_sql.Identifier, columns)))
        rows = rows if isinstance(rows, list) else list(rows)
        cursor = self.raw.cursor()
        if not _needs_escapes(rows):
            # psycopg's own text dumper, in C: _TextDumper is a Python call per value, which
            # cost the flush about 8 us an event (a third of the work COPY saves).
            cursor.adapters.register_dumper(str, StrDumper)
        with cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(row)

    def _pragma(self, sql: str) -> PostgresCursor:
        match = re.fullmatch(r"\s*PRAGMA\s+busy_timeout\s*=\s*(\d+)\s*;?\s*", sql, re.IGNORECASE)
        if match is None:
            raise psycopg.NotSupportedError(f"no PostgreSQL equivalent: {sql.strip()}")
        self.set_lock_timeout(int(match.group(1)))
        return PostgresCursor(self.raw.cursor())

    def _begin(self, *, immediate: bool) -> PostgresCursor:
        cursor = self.raw.cursor()
        if self.pipelined:
            self._end_reading()
            cursor.execute("BEGIN", prepare=False)
            cursor.execute(self._settings_sql(), prepare=False)
        else:
            self.begin()
        if immediate:
            cursor.execute(_LOCK, (WRITE_LOCK_KEY,))
        return PostgresCursor(cursor)

    def begin_sites(self, sites: Collection[int], *, shared: bool = False) -> psycopg.Cursor:
        """BEGIN a transaction that writes only these sites' rows (module doc): the three
        statements go in one round trip (in the caller's pipeline, if it has one). Returns
        the cursor of the site locks, which has a result once they are held. `shared`:
        the sites' locks shared, for writers that serialize among themselves otherwise
        (the payment writers)."""
        if self.pipelined:
            return self._begin_sites(sites, shared, prepare=None)
        # Never prepared here: a lock not had in time fails this pipeline part way, and
        # the flush retries on the same connection (pipeline() would make it stop
        # preparing).
        with self.raw.pipeline():
            return self._begin_sites(sites, shared, prepare=False)

    def _begin_sites(self, sites: Collection[int], shared: bool,
                     prepare: bool | None) -> psycopg.Cursor:
        cursor = self.raw.cursor()
        if self._reading:
            self._reading = False
            cursor.execute("COMMIT", prepare=prepare)
        cursor.execute("BEGIN", prepare=prepare)
        cursor.execute(self._settings_sql(), prepare=False)
        cursor.execute(_SHARED_LOCK, (WRITE_LOCK_KEY,), prepare=prepare)
        locks = self.raw.cursor()
        locks.execute(_SHARED_SITE_LOCKS if shared else _SITE_LOCKS,
                      (SITE_LOCK_KEY, sorted(int(site) for site in sites)), prepare=prepare)
        return locks

    @contextmanager
    def pipeline(self):
        """psycopg's pipeline mode: statements are sent without waiting for their results,
        which arrive when one is fetched or the block ends (then every error is raised). A
        block of statements then costs a round trip per result it reads, not one each."""
        try:
            with self.raw.pipeline() as pipeline:
                self.pipelined = pipeline
                try:
                    yield self
                finally:
                    self.pipelined = None
        except BaseException:
            self.stop_preparing()  # a PREPARE the server skipped after the error
            raise

    def analyze(self, tables: Sequence[str]) -> None:
        """Samples these tables' statistics now (a table another session is analyzing is
        skipped, not waited for); the server then plans every connection's statements and
        triggers on them again, and this connection's others too (discard_plans)."""
        self.raw.execute(f"ANALYZE (SKIP_LOCKED) {', '.join(tables)}",  # sql-safe: the caller's table names
                         prepare=False)
        self.discard_plans()

    def discard_plans(self) -> None:
        """The server plans each of this connection's statements again at its next run,
        for the tables as they are now (prepared statements keep their names), the
        foreign keys' checks included."""
        self.raw.execute("DISCARD PLANS", prepare=False)

    def set_lock_timeout(self, ms: int) -> None:
        """The lock_timeout of the transactions this connection opens from now on."""
        self.lock_wait_ms = int(ms)

    def commit(self) -> None:
        self.raw.execute("COMMIT")

    def rollback(self) -> None:
        self.raw.execute("ROLLBACK")

    def close(self) -> None:
        self.raw.close()


def _settings(*, parallel_query: bool = True, jit: bool = True) -> tuple[tuple[str, str], ...]:
    """The settings a connection's transactions set for themselves besides lock_timeout:
    no parallel workers for a read process's statements, no JIT compiling for the
    writers' (PostgresDatabase.connect)."""
    return ((() if parallel_query else (("max_parallel_workers_per_gather", "0"),))
            + (() if jit else (("jit", "off"),)))


def _connection_options(url: str, lock_timeout_ms: int,
                        settings: tuple[tuple[str, str], ...] = ()) -> dict:
    """psycopg's connection arguments. lock_timeout bounds the wait for the write lock
    (BEGIN IMMEDIATE), row locks and a table another session holds; SQLite's busy_timeout
    is the same bound. It and `settings` are the session's defaults from its start (the
    startup packet's `options`, after the URL's own), never a SET: a pooler in transaction
    mode would leave a SET on the server connection for its next client. Each transaction
    Tally opens sets them again for itself (PostgresConnection.begin), so they hold behind
    such a pooler too, where the startup `options` are not applied."""
    options = {"autocommit": True, "connect_timeout": max(1, lock_timeout_ms // 1000),
               "prepare_threshold": None}
    if "application_name=" not in url:
        options["application_name"] = "tally"
    pairs = [("lock_timeout", str(int(lock_timeout_ms))), *settings]
    own = conninfo_to_dict(url).get("options")
    options["options"] = " ".join([*([own] if own else []),
                                   *(f"-c {name}={value}" for name, value in pairs)])
    return options


def _configure(raw: psycopg.Connection) -> None:
    _adapt(raw)
    # UTC keeps any date function deterministic. PgBouncer keeps TimeZone per client.
    raw.execute("SET TIME ZONE 'UTC'")
    # A COMMIT returns once it is on disk, as with SQLite's synchronous = FULL: a server or URL
    # that turns synchronous_commit off is overruled (stronger settings, remote_apply, stay).
    raw.execute("SELECT set_config('synchronous_commit', 'on', false)"
                " WHERE current_setting('synchronous_commit') = 'off'")


def _connect(url: str, lock_timeout_ms: int,
             settings: tuple[tuple[str, str], ...] = ()) -> PostgresConnection:
    raw = psycopg.connect(url, **_connection_options(url, lock_timeout_ms, settings))
    _configure(raw)
    return PostgresConnection(raw, lock_timeout_ms, settings=settings)


def connect_as_is(url: str, lock_timeout_ms: int = BUSY_TIMEOUT_MS) -> PostgresConnection:
    """A connection of the caller's own that applies no schema (PostgresDatabase.connect
    brings the database up to date first)."""
    try:
        return _connect(url, lock_timeout_ms)
    except psycopg.Error as exc:
        raise storage_error(exc) from exc


# Tally's tables in the connection's schema. ANALYZE of a partitioned table samples it as a
# whole (which autovacuum never does) and then each partition.
_SCHEMA_TABLES = (
    "SELECT c.relname FROM pg_class c WHERE c.relkind IN ('r', 'p')"
    " AND NOT c.relispartition"
    " AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())"
    " ORDER BY c.relname")


def analyze_schema(conn: PostgresConnection) -> list[str]:
    """ANALYZE every table of the connection's schema (an autocommit connection, as
    connect_as_is makes); the names of the tables analyzed.

    A database just filled in bulk (a migration, a restore) is then planned for what it
    holds before autovacuum gets to it, or at all where autovacuum is off: unanalyzed, a
    filtered report over a million events ran as a nested loop, 3.8 s a statement instead
    of 0.3 (docs/perf-notes.md)."""
    try:
        tables = [row[0] for row in conn.raw.execute(_SCHEMA_TABLES)]
        for table in tables:
            conn.raw.execute(pg_sql.SQL("ANALYZE {}").format(pg_sql.Identifier(table)))
    except psycopg.Error as exc:
        raise storage_error(exc) from exc
    return tables


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


class PostgresDatabase:
    """Connections to one PostgreSQL database, schema applied once per process.

    Request threads share a small pool per process: `conn()` lends the thread a connection
    that it keeps until `release()` (app.py releases after every request), so a host opens
    at most workers x pool_size of them however many threads gunicorn runs. `connect()`
    makes a connection of the caller's own, outside the pool (the flush thread's).

    With a `read_url`, reads inside `replica_reads()` are lent connections to that replica
    while it is usable (storage/replica.py); a transaction they open runs on the primary.
    """

    dialect = "postgres"
    DatabaseError = psycopg.DatabaseError

    def __init__(self, url: str, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS,
                 pool_size: int = POOL_SIZE, read_url: str | None = None,
                 replica_max_lag: float = MAX_LAG, parallel_query: bool = True,
                 prepared_statements: bool = True):
        """`parallel_query`: whether the server may run a statement on several backends
        (a read process's is not: storage/read_processes.py). `prepared_statements`:
        whether connect(prepared=True) prepares (Config.database_prepared)."""
        self.url = url
        self.prepared_statements = prepared_statements
        self.busy_timeout_ms = int(busy_timeout_ms)
        self.pool_size = int(pool_size)
        self.parallel_query = parallel_query
        self.settings = _settings(parallel_query=parallel_query)
        self.replica = None if not read_url else Replica(
            read_url, replica_max_lag, pool_size=self.pool_size,
            connection_options=_connection_options(read_url, self.busy_timeout_ms,
                                                   self.settings),
            configure=_configure)
        self._pool: ConnectionPool | None = None
        self._pool_pid: int | None = None
        self._pool_lock = threading.Lock()
        self._local = threading.local()
        self._schema_lock = threading.Lock()
        self._schema_pid: int | None = None

    @property
    def location(self) -> str:
        return redact(self.url)

    def connect(self, *, synchronous: str | None = None, busy_timeout_ms: int | None = None,
                prepared: bool = False) -> PostgresConnection:
        """A connection of the caller's own. `prepared`: the statements it runs again and
        again are prepared on the server (parsed and planned once), for a connection that
        runs few statements many times (the payment writer's, the flush thread's), unless
        prepared statements are off for this database."""
        # The writers' own connections (the flush, payments, moves) run short statements
        # over many rows, whose plans the server may cost past jit_above_cost when a
        # table's statistics are stale: compiling one took 0.2 s, far more than the run.
        settings = _settings(parallel_query=self.parallel_query, jit=False)
        try:
            conn = _connect(self.url, self.busy_timeout_ms if busy_timeout_ms is None
                            else busy_timeout_ms, settings)
        except psycopg.Error as exc:
            raise storage_error(exc) from exc
        try:
            if prepared and self.prepared_statements:
                conn.raw.prepare_threshold = PREPARE_THRESHOLD
            self._ensure_schema(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def conn(self) -> PostgresConnection:
        """The connection lent to this thread, borrowed from the pool on first use."""
        local = self._local
        current = getattr(local, "conn", None)
        if getattr(local, "pid", None) == os.getpid() and current is not None:
            if not current.closed:
                return current
            self.release()
        raw = None
        if getattr(local, "replica_reads", False):
            raw = self.replica.getconn()
            if raw is None:  # the replica did not answer: this read goes to the primary
                local.replica_reads = False
            else:
                local.conn = PostgresConnection(raw, self.busy_timeout_ms, replica=True,
                                                settings=self.settings)
        if raw is None:
            local.conn = PostgresConnection(self._borrow(), self.busy_timeout_ms,
                                            settings=self.settings)
        local.pid = os.getpid()
        try:
            if not local.conn.replica:
                self._ensure_schema(local.conn)
            budget = getattr(local, "budget", None)
            if budget is not None:  # a connection replaced within a read budget keeps it
                local.conn.start_budget(budget)
        except BaseException:
            self.release()
            raise
        return local.conn

    def _borrow(self) -> psycopg.Connection:
        pool = self._connection_pool()
        try:
            return pool.getconn()
        except PoolTimeout as exc:
            raise StorageBusy(f"no database connection free within {pool.timeout:g} s") from exc
        except psycopg.Error as exc:
            raise storage_error(exc) from exc

    @contextmanager
    def replica_reads(self):
        """Inside, this thread's reads use the replica while it is usable: conn() lends a
        connection to it, and a transaction opened on that connection (storing final days)
        runs on the primary. Raises ReplicaLost when the replica failed during the block
        (its connection broke, or the replica canceled a statement that conflicted with
        its recovery): the caller reads again from the primary."""
        local = self._local
        if (self.replica is None or getattr(local, "replica_reads", False)
                or self._schema_pid != os.getpid()
                or not self.replica.usable(self._primary_position)):
            yield
            return
        self.release()
        local.replica_reads, local.pid = True, os.getpid()
        try:
            yield
        except BaseException as exc:
            current = getattr(local, "conn", None)
            if current is not None and current.replica and (
                    current.closed or _replica_conflict(exc)):
                if current.closed:
                    self.replica.lost(exc)
                raise ReplicaLost(one_line(exc)) from exc
            raise
        finally:
            local.replica_reads = False
            self.release()

    def _primary_position(self) -> int:
        with self._connection_pool().connection() as raw:
            return int(raw.execute(PRIMARY_POSITION).fetchone()[0])

    def _writer(self, reader: PostgresConnection) -> PostgresConnection:
        """A primary connection for a transaction a read on the replica opens, waiting for
        locks as long as the reader was told to."""
        local = self._local
        writer = getattr(local, "writer", None)
        if writer is None or writer.closed:
            writer = local.writer = PostgresConnection(self._borrow(), self.busy_timeout_ms,
                                                       settings=self.settings)
        if writer.lock_wait_ms != reader.lock_wait_ms:
            writer.set_lock_timeout(reader.lock_wait_ms)
        return writer

    def checkpoint(self, conn: PostgresConnection) -> None:
        """Nothing to do: the server recycles its own write-ahead log (storage.db's does the
        work for SQLite)."""

    @contextmanager
    def read_budget(self, seconds: float | None, *,
                    check_steps: int = READ_BUDGET_CHECK_STEPS,
                    clock: Callable[[], float] = time.monotonic, since: float | None = None):
        """Stop this thread's statements once `seconds` have passed (since `since`, a
        reading of `clock`, or now): the server cancels a
        statement at statement_timeout (the time left), and none starts after the deadline;
        either raises ReadBudgetExceeded out of the block (None: no budget). Inside an
        outer budget, the outer one holds. On the way out the lent connection gets its own
        statement_timeout back and any transaction the stop cut short is rolled back, so
        the pool lends it healthy. `check_steps` is SQLite's (storage.db.Database)."""
        local = self._local
        if seconds is None or getattr(local, "budget", None) is not None:
            yield
            return
        budget = Budget(seconds, clock, since)
        local.budget = budget
        try:
            self.conn().start_budget(budget)
            yield
        finally:
            local.budget = None
            current = getattr(local, "conn", None)
            if current is not None and getattr(local, "pid", None) == os.getpid():
                current.end_budget()

    def release(self) -> None:
        """Give this thread's connections back to their pools (a no-op when it has none)."""
        local = self._local
        current = getattr(local, "conn", None)
        writer = getattr(local, "writer", None)
        local.conn = local.writer = None
        if getattr(local, "pid", None) != os.getpid():
            return
        if current is not None and current.budget is not None:
            current.end_budget()
        for lent in (current, writer):
            if lent is None:
                continue
            _abandon(lent)
            if lent.replica:
                self.replica.putconn(lent.raw)
                continue
            pool = self._pool
            if pool is not None and self._pool_pid == os.getpid():
                pool.putconn(lent.raw)
            else:
                lent.close()

    def _connection_pool(self) -> ConnectionPool:
        with self._pool_lock:
            if self._pool is None or self._pool_pid != os.getpid():
                lock_timeout_ms = self.busy_timeout_ms
                # A process opens its pool after the fork; a parent's pool is left alone.
                self._pool = ConnectionPool(
                    self.url, min_size=1, max_size=self.pool_size, open=True, name="tally",
                    kwargs=_connection_options(self.url, lock_timeout_ms, self.settings),
                    configure=_configure,
                    # A connection the server ended (restart, failover) is replaced at
                    # checkout instead of failing the request that draws it.
                    check=ConnectionPool.check_connection,
                    timeout=lock_timeout_ms / 1000)
                self._pool_pid = os.getpid()
            return self._pool

    def size_bytes(self) -> tuple[int, int]:
        """(Tally's tables with their indexes and TOAST, 0): the WAL is the server's, shared."""
        row = self.conn().execute(_SIZE).fetchone()
        return int(row[0]), 0

    def exists(self) -> bool:
        """Whether Tally's schema is there; connect() would create it."""
        try:
            conn = _connect(self.url, self.busy_timeout_ms)
        except psycopg.Error as exc:
            raise storage_error(exc) from exc
        try:
            return schema_version(conn) > 0
        finally:
            conn.close()

    def schema_version(self) -> int:
        return schema_version(self.conn())

    @property
    def latest_version(self) -> int:
        """The version this release brings a database to."""
        return migrations.postgres_version()

    def ping(self) -> None:
        try:
            self.conn().execute("SELECT 1").fetchone()
        except psycopg.Error as exc:
            raise storage_error(exc) from exc

    def close(self) -> None:
        """Release this thread's connection and close the process's pools."""
        self.release()
        if self.replica is not None:
            self.replica.close()
        with self._pool_lock:
            if self._pool is not None and self._pool_pid == os.getpid():
                self._pool.close()
            self._pool = None
        self._local = threading.local()

    @contextmanager
    def transaction(self, conn: PostgresConnection | None = None, *,
                    sites: Collection[int] | None = None):
        """BEGIN ... COMMIT holding the write lock; with `sites`, only those sites' locks
        and the write lock shared: for a transaction that writes only rows of those sites
        (and monthly usage, by upsert), which then never waits for other sites'."""
        conn = conn or self.conn()
        if conn.replica:
            conn = self._writer(conn)
        try:
            if sites is None:
                conn.execute("BEGIN IMMEDIATE")
            else:
                conn.begin_sites(sites)
            yield conn
            conn.commit()
        except BaseException as exc:
            _abandon(conn)
            if isinstance(exc, psycopg.Error):
                raise storage_error(exc) from exc
            raise

    def grouped_transaction(self, conn: PostgresConnection, items: list,
                            write: Callable[[object], None], *, sites: Collection[int],
                            more: Callable[[], list] | None = None,
                            lock_items: Callable[[list], PostgresCursor] | None = None,
                            ) -> list[BaseException | None]:
        """One transaction for all `items`, holding the locks of `sites` (as transaction(sites=)
        does), each item written by `write(item)` inside a SAVEPOINT of its own: an item whose
        write fails is rolled back alone. Returns each item's failure (None: stored), a
        psycopg error as StorageBusy / StorageError. Raises, as StorageBusy / StorageError,
        what fails the transaction as a whole (the locks, the COMMIT, the connection, a
        deadlock or serialization failure, which only a new transaction can get past), and
        then nothing of it is stored.

        Pipelined: an item's statements go out without waiting for each other, and a Sync
        closes each item. In pipeline mode an error makes the server skip every statement
        up to the next Sync, and psycopg raises it at whichever later call reads it; the
        Sync keeps an item's error inside that item, and the item's SAVEPOINT is rolled
        back only once the Sync has been reached.

        First the group goes all at once: the locks, every item's statements and the
        COMMIT in one pipeline, read back once at its end (no SAVEPOINT, no Sync between
        items: one round trip for the group when `write` reads nothing back). An item's
        error there leaves nothing of the group stored, and then the group runs again as
        above, item by item. With `more`, the locks are waited for first (a round trip of
        their own), and `more()` then gives items that arrived meanwhile, of `sites` only:
        they are appended to `items` (the caller's list) and written too.

        With `lock_items`, the sites' locks are taken shared (the flush and the sites'
        other writers still exclude the group) and `lock_items(items)` sends, before any
        item, the statements that take the locks the items need against other such
        groups, returning the cursor of the last; their failure is the group's."""
        try:
            if _all_at_once(conn, items, write, sites, more, lock_items):
                return [None] * len(items)
        except BaseException as exc:
            conn.stop_preparing()
            _abandon(conn)
            if isinstance(exc, psycopg.Error):
                raise storage_error(exc) from exc
            raise
        conn.stop_preparing()
        failures: list[BaseException | None] = []
        try:
            with conn.pipeline():
                pipeline = conn.pipelined
                conn.begin_sites(sites, shared=lock_items is not None)
                if lock_items is not None:
                    lock_items(items)
                pipeline.sync()  # the locks' failure is the group's, not its first item's
                cursor = conn.raw.cursor()
                for item in items:
                    cursor.execute("SAVEPOINT item")
                    try:
                        write(item)
                        cursor.execute("RELEASE item")
                        pipeline.sync()
                        failures.append(None)
                    except Exception as exc:
                        if conn.closed or isinstance(exc, _CONFLICTS):
                            raise
                        _reach_sync(conn, pipeline)
                        cursor.execute("ROLLBACK TO item")
                        cursor.execute("RELEASE item")
                        pipeline.sync()
                        failures.append(storage_error(exc) if isinstance(exc, psycopg.Error)
                                        else exc)
                        if isinstance(exc, psycopg.Error):
                            failures[-1].__cause__ = exc
                conn.commit()
        except BaseException as exc:
            _abandon(conn)
            if isinstance(exc, psycopg.Error):
                raise storage_error(exc) from exc
            raise
        return failures

    @contextmanager
    def storage_errors(self):
        """Maps psycopg's errors inside the block as transaction() does, for a read on the
        request path: a lock wait past lock_timeout or a lost connection is StorageBusy."""
        try:
            yield
        except psycopg.Error as exc:
            raise storage_error(exc) from exc

    @contextmanager
    def snapshot(self, conn: PostgresConnection | None = None):
        """A read transaction at REPEATABLE READ: every query inside sees one state."""
        conn = conn or self.conn()
        conn.begin("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            yield conn
        finally:
            _abandon(conn, finish="COMMIT")

    def check_startup(self) -> None:
        """Connect, apply the schema and prove a write can be made, or raise StorageError."""
        try:
            conn = self.connect()
            try:
                conn.begin()
                conn.raw.execute("SELECT version FROM tally_schema_version FOR UPDATE")
                conn.raw.execute("ROLLBACK")
            finally:
                conn.close()
        except (psycopg.Error, StorageError) as exc:
            raise StorageError(f"cannot open database {self.location}: {one_line(exc)}") from exc

    def _ensure_schema(self, conn: PostgresConnection) -> None:
        if self._schema_pid == os.getpid():
            return
        with self._schema_lock:
            if self._schema_pid == os.getpid():
                return
            apply_schema(conn)
            self._schema_pid = os.getpid()


def _replica_conflict(exc: BaseException) -> bool:
    """Whether the replica canceled a statement because its recovery needed what the
    statement read (SQLSTATE 40001 on a standby): the read may run on the primary."""
    while exc is not None:
        if getattr(exc, "sqlstate", None) == "40001":
            return True
        exc = exc.__cause__
    return False


# Errors that end a statement because of another transaction: the item's SAVEPOINT
# would not get past them, a new transaction may (storage/payments.py runs it again).
_CONFLICTS = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)


def is_conflict(exc: BaseException) -> bool:
    """Whether a transaction failed for a deadlock or serialization failure (directly or
    as the StorageBusy mapped from one): running it again can succeed."""
    return any(isinstance(failure, _CONFLICTS) for failure in (exc, exc.__cause__))


def _all_at_once(conn: PostgresConnection, items: list, write: Callable[[object], None],
                 sites: Collection[int], more: Callable[[], list] | None = None,
                 lock_items: Callable[[list], PostgresCursor] | None = None) -> bool:
    """grouped_transaction's group in one pipelined transaction without SAVEPOINTs. True:
    committed. False: an item failed and the transaction was rolled back. Raises what the
    group as a whole fails with (the locks, the connection, a deadlock or serialization
    failure)."""
    locks = None
    try:
        with conn.pipeline():
            locks = conn.begin_sites(sites, shared=lock_items is not None)
            if more is not None:
                conn.pipelined.sync()  # the locks held: what arrived meanwhile joins
                items.extend(more())
            if lock_items is not None:
                locks = lock_items(items)._cursor
            for item in items:
                write(item)
            conn.commit()
    except Exception as exc:
        if conn.closed or isinstance(exc, _CONFLICTS) or locks is None or locks.pgresult is None:
            raise
        _abandon(conn)
        return False
    return True


def _reach_sync(conn: PostgresConnection, pipeline: psycopg.Pipeline) -> None:
    """Read every result up to the pipeline's next Sync, the errors among them (the one
    already raised, or statements the server skipped after it) swallowed: past it, the
    server takes statements again. Raises when the connection itself is gone."""
    try:
        pipeline.sync()
    except psycopg.Error:
        if conn.closed:
            raise


def _abandon(conn: PostgresConnection, finish: str = "ROLLBACK") -> None:
    if conn.closed:
        return
    try:
        if conn.in_transaction:
            conn.raw.execute(finish)
    except psycopg.Error:
        conn.raw.close()


@functools.cache
def postgres_script() -> str:
    return SCHEMA_PATH.read_text(encoding="utf-8")


def schema_version(conn: PostgresConnection) -> int:
    row = conn.raw.execute(
        "SELECT to_regclass('tally_schema_version') IS NOT NULL").fetchone()
    if not row[0]:
        return 0
    row = conn.raw.execute("SELECT version FROM tally_schema_version").fetchone()
    return 0 if row is None else int(row[0])


def apply_schema(conn: PostgresConnection) -> None:
    """Create what is missing and record the version; one process at a time."""
    version = migrations.postgres_version()
    found = schema_version(conn)
    if found > version:
        raise SchemaTooNew(found, version)
    if found == version:
        return
    raw = conn.raw
    with raw.transaction():
        raw.execute(f"SET LOCAL lock_timeout = {SCHEMA_LOCK_TIMEOUT_MS}")  # sql-safe: an int
        raw.execute(_LOCK, (SCHEMA_LOCK_KEY,))
        raw.execute("CREATE TABLE IF NOT EXISTS tally_schema_version ("
                    " version BIGINT NOT NULL, one_row BOOLEAN PRIMARY KEY DEFAULT true"
                    " CHECK (one_row))")
        found = schema_version(conn)
        if found > version:  # a later release's host upgraded it meanwhile
            raise SchemaTooNew(found, version)
        if found < version:
            if found:
                log.info("upgrading the PostgreSQL schema from version %d to %d%s", found, version,
                         " (moving events into monthly partitions: one pass over the table)"
                         if found < 22 else "")
            for statement in migrations.postgres_steps_before(found):
                raw.execute(statement)
            raw.execute(postgres_script())
            for statement in migrations.postgres_steps(found):
                raw.execute(statement)
            raw.execute("INSERT INTO tally_schema_version (version) VALUES (%s)"
                        " ON CONFLICT (one_row) DO UPDATE SET version = excluded.version",
                        (version,))
