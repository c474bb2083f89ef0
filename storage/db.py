"""Connections to the SQLite file and the schema they need.

Opening is lazy: constructing a Database touches no file, so importing the app
starts nothing. Each thread gets its own connection; the schema is applied once
per process, the first time any connection is made.
"""

from __future__ import annotations

import _thread
import errno
import fcntl
import functools
import os
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path

from storage import migrations

# storage/schema.sql is a symlink to the top-level schema.sql, the source of truth; the
# build copies its content into the package, so an installed or zipped Tally finds it too.
SCHEMA_PATH = files(__package__) / "schema.sql"


@functools.cache
def schema() -> tuple[int, str]:
    """(user_version, script) of schema.sql, read on first use so importing opens no file."""
    script = SCHEMA_PATH.read_text(encoding="utf-8")
    return int(re.search(r"PRAGMA user_version = (\d+);", script).group(1)), script

# How long a request-path write waits for the write lock before it is answered 503.
BUSY_TIMEOUT_MS = 5_000
# How often a transaction waiting for SQLite's write lock tries again, once it has its
# turn (below) or when it has none. SQLite's own busy handler backs off to 100 ms sleeps,
# so a writer that has waited a while sleeps through the moments the lock is free and
# later arrivals take it first; trying every millisecond takes the lock within a
# millisecond of its release, for a few microseconds of CPU a try.
WRITE_LOCK_POLL_S = 0.001
# The write turn: before BEGIN IMMEDIATE every writer of Database.connect's connections
# (each worker's payment writer and flush thread, the request path's own writes, in every
# process) takes an exclusive flock on this file beside the database, and gives it back
# after COMMIT or ROLLBACK. A writer waiting for its turn sleeps in the kernel and is woken
# the moment the turn is given back, instead of finding the lock free only at its next
# try; the kernel drops a killed process's flock. A file that cannot be opened (a
# read-only folder) leaves the writers polling SQLite's lock alone, as they did before.
WRITE_TURN_SUFFIX = "-writeturn"


class _TurnWait:
    """A blocking flock taken in a thread of its own, so that its caller can stop waiting at
    its deadline (a flock wait cannot time out). A wait given up keeps its place in the
    kernel's queue and is taken up again by the connection's next transaction; one that
    gets the flock while given up gives it back and closes its descriptor."""

    def __init__(self, fd: int):
        self.fd = fd
        self.done = _thread.allocate_lock()
        self.done.acquire()
        self.guard = _thread.allocate_lock()
        self.got = self.given_up = self.finished = False

    def run(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            got = True
        except OSError:
            got = False
        with self.guard:
            self.finished = True
            if self.given_up:
                if got:
                    fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
                return
            self.got = got
        self.done.release()

    def wait(self, timeout: float) -> bool:
        """Whether the flock is held by the time `timeout` (seconds) has passed; if not, the
        wait is given up (and the descriptor with it)."""
        self.done.acquire(timeout=max(timeout, 0))
        with self.guard:
            if self.got:
                return True
            if self.finished:
                os.close(self.fd)  # the flock failed: nothing more comes
            else:
                self.given_up = True
            return False

    def take_up(self) -> bool:
        """Waits again, if the wait given up is still in the kernel's queue."""
        with self.guard:
            if self.finished:
                return False
            self.given_up = False
            return True


class _WriteTurn:
    """A connection's turn for the write lock: an exclusive flock on WRITE_TURN_SUFFIX's
    file through a descriptor of the connection's own (a flock belongs to its open file, so
    two threads of a process each wait for their own), opened at the first write."""

    def __init__(self, path: str):
        self.path = path
        self.fd: int | None = None
        self.pid = 0
        self.held = False
        self.pending: _TurnWait | None = None  # a wait given up, still queued

    def take(self, deadline: float) -> bool:
        """Waits for the turn up to `deadline` (time.monotonic); False when it did not come
        or there is no file to lock (then the caller waits for SQLite's lock alone)."""
        if self.pid != os.getpid():
            # After a fork the parent's descriptor shares the parent's flock: never given
            # back or closed here; the parent's waits are not this process's.
            self.fd, self.held, self.pending = None, False, None
        waiting, self.pending = self.pending, None
        if waiting is None or not waiting.take_up():
            fd = self._descriptor()
            if fd is None:
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.held = True
                return True
            except BlockingIOError:
                pass
            except OSError:
                return False  # a file system without flock: SQLite's lock alone
            waiting = _TurnWait(fd)
            self.fd = None  # the wait's until it has the flock
            _thread.start_new_thread(waiting.run, ())
        if waiting.wait(deadline - time.monotonic()):
            self.fd, self.held = waiting.fd, True
            return True
        self.pending = waiting
        return False

    def give_back(self) -> None:
        if self.held:
            self.held = False
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self.fd is not None and self.pid == os.getpid():
            os.close(self.fd)
        self.fd, self.held = None, False
        self.pending = None  # given up: it closes its own descriptor when the flock comes

    def _descriptor(self) -> int | None:
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except OSError:
                try:  # a lock file another user made: flock needs no write access
                    self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    return None
            self.pid = os.getpid()
        return self.fd


class _Connection(sqlite3.Connection):
    """A connection that remembers how long its transactions wait for the write lock, and
    its turn for it."""

    lock_wait_ms: int | None = None
    write_turn: _WriteTurn | None = None

    def close(self) -> None:
        if self.write_turn is not None:
            self.write_turn.close()
        super().close()

    def __del__(self) -> None:
        if self.write_turn is not None:
            self.write_turn.close()


class StorageError(Exception):
    """The database cannot do what was asked (corrupt, unwritable, full)."""


class SchemaTooNew(StorageError):
    """The database was brought to a schema version above this release's by a later
    release: this code does not know what that version changed, so it writes nothing."""

    def __init__(self, found: int, known: int):
        super().__init__(
            f"the database is at schema version {found}, newer than this release of Tally"
            f" knows ({known}): a later release wrote it; run that release or a later one"
            f" (README: Upgrades), or restore a backup this release made")
        self.found, self.known = found, known


class StorageBusy(StorageError):
    """A transient condition: the write lock stayed taken past the bounded wait."""


class ReplicaLost(StorageBusy):
    """The read replica failed a read (storage/replica.py): the read runs again on the
    primary."""


class ReadBudgetExceeded(Exception):
    """A read ran past its budget (Database.read_budget) and its statement was stopped.

    Not a StorageError: nothing is wrong with the database, and no caller may take it for
    a failed write to skip and carry on."""

    def __init__(self, seconds: float):
        super().__init__(f"the read ran past its budget of {seconds:g} s and was stopped")
        self.seconds = seconds


# How often SQLite asks a read budget whether its time is up, in virtual-machine steps:
# about every 6 ms of a scan here (some 16 million steps a second). Each check takes the
# GIL, which the threads taking in events want too: checking ten times as often cost
# them more latency under load (bench/reads.py) and gained nothing but a finer stop.
# A statement of fewer steps than MIN_CHECK_STEPS (BEGIN, COMMIT, ROLLBACK, PRAGMA: under
# 50) is never stopped, so a transaction always ends.
READ_BUDGET_CHECK_STEPS = 100_000
MIN_CHECK_STEPS = 100


class Budget:
    """A deadline on this thread's statements, `seconds` after it starts (or `since`, an
    earlier reading of `clock`: when the read was asked for)."""

    __slots__ = ("seconds", "clock", "deadline", "tripped")

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic,
                 since: float | None = None):
        self.seconds = seconds
        self.clock = clock
        self.deadline = (clock() if since is None else since) + seconds
        self.tripped = False

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def passed(self) -> bool:
        """True once the deadline has passed (and ever after): SQLite's progress handler,
        whose true stops the running statement."""
        if not self.tripped and self.clock() >= self.deadline:
            self.tripped = True
        return self.tripped


def is_transient(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return "locked" in str(exc) or "busy" in str(exc)
    return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


# Conditions of the database file or the machine, not of the data written: a retry can
# succeed once the lock is free, the disk has room or the file is writable again.
_TRANSIENT_CODES = frozenset({
    sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_NOMEM,
    sqlite3.SQLITE_PROTOCOL, sqlite3.SQLITE_NOLFS,
})
_TRANSIENT_WORDS = ("locked", "busy", "disk", "full", "I/O", "readonly", "read-only",
                    "unable to open")


def is_transient_failure(exc: BaseException) -> bool:
    """Whether retrying the same write can succeed (busy, locked, disk full, I/O, ...).

    Anything else (a constraint, a datatype, a bug in our code) fails again on retry.
    Accepts a StorageError raised from a sqlite3.Error (Database.transaction) too, and
    PostgreSQL's errors (storage.postgres.is_transient).
    """
    if isinstance(exc, StorageBusy | OSError):
        return True
    error = exc if isinstance(exc, sqlite3.Error) else exc.__cause__
    postgres = sys.modules.get("storage.postgres")  # loaded when PostgreSQL is the backend
    if postgres is not None:
        for failure in (exc, exc.__cause__):
            if isinstance(failure, postgres.psycopg.Error):
                return postgres.is_transient(failure)
    if not isinstance(error, sqlite3.Error):
        return False
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _TRANSIENT_CODES
    return isinstance(error, sqlite3.OperationalError) and any(
        word in str(error) for word in _TRANSIENT_WORDS)


def is_disk_full(exc: BaseException) -> bool:
    """Whether a write failed for want of disk space (SQLite's SQLITE_FULL, ENOSPC,
    PostgreSQL's disk_full): a smaller write may fit where this one did not."""
    for failure in (exc, exc.__cause__):
        if isinstance(failure, OSError) and failure.errno == errno.ENOSPC:
            return True
        if isinstance(failure, sqlite3.Error):
            code = getattr(failure, "sqlite_errorcode", None)
            if code is not None:
                return code & 0xFF == sqlite3.SQLITE_FULL
            return "disk is full" in str(failure)
        if getattr(failure, "sqlstate", None) == "53100":  # PostgreSQL's disk_full
            return True
    return False


class Database:
    dialect = "sqlite"
    DatabaseError = sqlite3.DatabaseError

    def __init__(self, path: str, *, synchronous: str = "FULL", busy_timeout_ms: int = BUSY_TIMEOUT_MS):
        if path.startswith(("postgresql://", "postgres://")):
            raise ValueError("a PostgreSQL URL is not a SQLite file: use storage.backend.open_database")
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout_ms = int(busy_timeout_ms)
        self._local = threading.local()
        # Connections given back by release(), lent again by conn(): the request threads
        # of a worker then hold as many as serve a request at once, not one each (a
        # connection holds ~0.25 MiB: the parsed schema, its caches).
        self._idle: list[sqlite3.Connection] = []
        self._idle_lock = threading.Lock()
        self._idle_pid = os.getpid()
        self._schema_lock = threading.Lock()
        self._schema_pid: int | None = None

    @property
    def location(self) -> str:
        return self.path

    def connect(self, *, synchronous: str | None = None, busy_timeout_ms: int | None = None,
                prepared: bool = False) -> sqlite3.Connection:
        """A new connection in autocommit mode; transactions are explicit. busy_timeout_ms:
        its own bound on waiting for the write lock, once the schema is in place.
        `prepared` is PostgreSQL's (sqlite3 keeps every connection's statements prepared)."""
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout_ms / 1000, isolation_level=None,
            check_same_thread=False, factory=_Connection,
        )
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            # sql-safe: PRAGMAs take no parameters; both values are constants chosen in code.
            conn.execute(f"PRAGMA synchronous = {synchronous or self.synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")  # sql-safe: an int
            self._ensure_schema(conn)
            if busy_timeout_ms is not None:
                conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")  # sql-safe: an int
            conn.lock_wait_ms = int(self.busy_timeout_ms if busy_timeout_ms is None
                                    else busy_timeout_ms)
            if self.path != ":memory:":
                conn.write_turn = _WriteTurn(self.path + WRITE_TURN_SUFFIX)
        except (sqlite3.DatabaseError, StorageError):
            conn.close()
            raise
        return conn

    def conn(self) -> sqlite3.Connection:
        """This thread's connection until release(): one given back earlier, or a new one
        (after a fork, never the parent's)."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid() or local.conn is None:
            local.conn = self._idle_connection() or self.connect()
            local.pid = os.getpid()
        return local.conn

    def _idle_connection(self) -> sqlite3.Connection | None:
        with self._idle_lock:
            if self._idle_pid != os.getpid():
                self._idle, self._idle_pid = [], os.getpid()
            return self._idle.pop() if self._idle else None

    def size_bytes(self) -> tuple[int, int]:
        """(database file, write-ahead log) in bytes; 0 for a file not there."""
        sizes = []
        for path in (self.path, self.path + "-wal"):
            try:
                sizes.append(os.stat(path).st_size)
            except OSError:
                sizes.append(0)
        return sizes[0], sizes[1]

    def exists(self) -> bool:
        """Whether the file is there; connect() would create it."""
        return self.path != ":memory:" and os.path.isfile(self.path)

    def schema_version(self) -> int:
        return int(self.conn().execute("PRAGMA user_version").fetchone()[0])

    @property
    def latest_version(self) -> int:
        """The version this release brings a database to."""
        return schema()[0]

    def ping(self) -> None:
        """One trivial query: raises when the database cannot be read."""
        self.conn().execute("SELECT 1").fetchone()

    def checkpoint(self, conn: sqlite3.Connection) -> None:
        """Copy what the write-ahead log holds into the file, without waiting for anyone, so
        the next transaction writes the log from its start instead of growing it: on a full
        disk, what a stored transaction took in the log is reused. Best effort."""
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error:
            pass  # the file could not grow either: the log keeps the frames, nothing is lost

    @contextmanager
    def replica_reads(self):
        """Nothing to route: SQLite has no replica (PostgreSQL's Database reads from one
        inside this block when it has one)."""
        yield

    def release(self) -> None:
        """Give this thread's connection back for the next thread that needs one (as
        PostgreSQL's Database does with its pool); kept while a transaction or a read
        budget is open on it."""
        local = self._local
        conn = getattr(local, "conn", None)
        if (conn is None or local.pid != os.getpid() or conn.in_transaction
                or getattr(local, "budget", None) is not None):
            return
        local.conn = None
        with self._idle_lock:
            if self._idle_pid != os.getpid():
                self._idle, self._idle_pid = [], os.getpid()
            self._idle.append(conn)

    @contextmanager
    def read_budget(self, seconds: float | None, *,
                    check_steps: int = READ_BUDGET_CHECK_STEPS,
                    clock: Callable[[], float] = time.monotonic, since: float | None = None):
        """Stop this thread's statements once `seconds` have passed (since `since`, a
        reading of `clock`, or now): SQLite's progress handler interrupts the running
        statement, which raises ReadBudgetExceeded out of the block (None: no budget).
        Inside an outer budget, the outer one holds. A transaction the stop cut short is
        rolled back, so nothing half-counted is kept."""
        if seconds is None or getattr(self._local, "budget", None) is not None:
            yield
            return
        conn = self.conn()
        budget = Budget(seconds, clock, since)
        self._local.budget = budget
        conn.set_progress_handler(budget.passed, max(MIN_CHECK_STEPS, int(check_steps)))
        try:
            yield
        except sqlite3.OperationalError as exc:
            if budget.tripped and _interrupted(exc):
                raise ReadBudgetExceeded(seconds) from exc
            raise
        finally:
            conn.set_progress_handler(None, 0)
            self._local.budget = None
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    def _error(self, exc: sqlite3.Error) -> Exception:
        budget = getattr(self._local, "budget", None)
        if budget is not None and budget.tripped and _interrupted(exc):
            return ReadBudgetExceeded(budget.seconds)
        return _storage_error(exc)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        self._local = threading.local()
        with self._idle_lock:
            idle = self._idle if self._idle_pid == os.getpid() else []
            self._idle, self._idle_pid = [], os.getpid()
        for conn in idle:
            conn.close()

    @contextmanager
    def transaction(self, conn: sqlite3.Connection | None = None, *, sites=None):
        """BEGIN IMMEDIATE ... COMMIT, with errors mapped to StorageBusy/StorageError.
        `sites`: the sites whose rows alone the transaction writes; SQLite has one writer
        whatever they are (PostgreSQL's Database lets other sites write meanwhile)."""
        conn = conn or self.conn()
        try:
            begin_immediate(conn)
        except sqlite3.Error as exc:
            raise _storage_error(exc) from exc
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc) from exc
            raise
        finally:
            give_back_turn(conn)

    def grouped_transaction(self, conn: sqlite3.Connection, items: list,
                            write: Callable[[object], None], *, sites=None,
                            more: Callable[[], list] | None = None) -> list[BaseException | None]:
        """grouped_transaction below (`sites`: as transaction's; SQLite has one writer)."""
        return grouped_transaction(conn, items, write, more)

    @contextmanager
    def storage_errors(self):
        """Maps sqlite's errors inside the block as transaction() does, for a read on the
        request path: a busy or locked file is StorageBusy (503), not an unhandled error."""
        try:
            yield
        except sqlite3.Error as exc:
            raise _storage_error(exc) from exc

    @contextmanager
    def snapshot(self, conn: sqlite3.Connection | None = None):
        """A read transaction (BEGIN ... COMMIT): every query inside sees one state."""
        conn = conn or self.conn()
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def check_startup(self) -> None:
        """Open, apply the schema, check the file's integrity and prove it is writable
        (SQLite opens a read-only file without complaint), or raise StorageError."""
        try:
            conn = self.connect()
            try:
                problems = integrity_problems(conn)
                if not problems:
                    _probe_write(conn)
            finally:
                conn.close()
        except (sqlite3.Error, OSError) as exc:
            raise StorageError(f"cannot open database {self.path}: {exc}") from exc
        if problems:
            raise StorageError(damaged(self.path, problems))

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        if self._schema_pid == os.getpid():
            return
        with self._schema_lock:
            if self._schema_pid == os.getpid():
                return
            version, script = schema()
            found = conn.execute("PRAGMA user_version").fetchone()[0]
            if found > version:
                raise SchemaTooNew(found, version)
            if found < version:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    found = conn.execute("PRAGMA user_version").fetchone()[0]
                    if found < version:
                        migrations.before_script(conn, found)
                        for statement in _statements(script):
                            conn.execute(statement)
                        migrations.after_script(conn, found)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            self._schema_pid = os.getpid()


def begin_immediate(conn: sqlite3.Connection) -> None:
    """BEGIN IMMEDIATE, waiting for the write lock up to the connection's busy timeout: first
    for the connection's write turn (WRITE_TURN_SUFFIX), then for SQLite's lock by trying
    again every WRITE_LOCK_POLL_S (SQLite's lock is tried at least once, turn or not, so a
    timeout is SQLite's own "database is locked"). A connection not made by
    Database.connect waits as SQLite's busy handler does. The turn is given back by
    give_back_turn, after the transaction's COMMIT or ROLLBACK (or here, on a failure)."""
    wait_ms = getattr(conn, "lock_wait_ms", None)
    if not wait_ms:
        conn.execute("BEGIN IMMEDIATE")
        return
    deadline = time.monotonic() + wait_ms / 1000
    turn = conn.write_turn
    took = turn is not None and not turn.held and turn.take(deadline)
    try:
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    if not is_transient(exc) or time.monotonic() >= deadline:
                        raise
                time.sleep(WRITE_LOCK_POLL_S)
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")  # sql-safe: an int
    except BaseException:
        if took:
            turn.give_back()
        raise


def give_back_turn(conn: sqlite3.Connection) -> None:
    """Gives back the write turn begin_immediate took, once the transaction has ended."""
    turn = getattr(conn, "write_turn", None)
    if turn is not None:
        turn.give_back()


def grouped_transaction(conn: sqlite3.Connection, items: list,
                        write: Callable[[object], None],
                        more: Callable[[], list] | None = None) -> list[BaseException | None]:
    """One BEGIN IMMEDIATE ... COMMIT for all `items`, each written by `write(item)`: an
    item whose write raises is rolled back alone. Returns each item's failure (None:
    stored). Raises what fails the transaction as a whole (the lock, the COMMIT, SQLite
    rolling everything back), and then nothing of it is stored. `more()`, called once the
    write lock is held, gives items that arrived while it was awaited: they are appended
    to `items` (the caller's list) and written too.

    The items go first under one SAVEPOINT for them all; only when one raises is that
    rolled back and each item written again inside a SAVEPOINT of its own (the lock is
    kept throughout)."""
    begin_immediate(conn)
    try:
        if more is not None:
            items.extend(more())
        if not _all_at_once(conn, items, write):
            failures = _item_by_item(conn, items, write)
        else:
            failures = [None] * len(items)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        give_back_turn(conn)
    return failures


def _all_at_once(conn: sqlite3.Connection, items: list, write: Callable[[object], None]) -> bool:
    """Every item written under one SAVEPOINT: True, or False with it rolled back because
    an item raised."""
    conn.execute("SAVEPOINT items")
    try:
        for item in items:
            write(item)
    except Exception:
        if not conn.in_transaction:
            raise  # the whole transaction is gone (a full disk, I/O): all fail
        conn.execute("ROLLBACK TO items")
        conn.execute("RELEASE items")
        return False
    conn.execute("RELEASE items")
    return True


def _item_by_item(conn: sqlite3.Connection, items: list,
                  write: Callable[[object], None]) -> list[BaseException | None]:
    failures: list[BaseException | None] = []
    for item in items:
        conn.execute("SAVEPOINT item")
        try:
            write(item)
            failures.append(None)
        except Exception as exc:
            if not conn.in_transaction:
                raise  # the whole transaction is gone (a full disk, I/O): all fail
            conn.execute("ROLLBACK TO item")
            failures.append(exc)
        conn.execute("RELEASE item")
    return failures


def set_busy_timeout(conn, ms: int) -> None:
    """How long this connection waits for the write lock: SQLite's busy_timeout, PostgreSQL's
    lock_timeout."""
    if getattr(conn, "dialect", "sqlite") == "postgres":
        conn.set_lock_timeout(ms)
    else:
        conn.execute(f"PRAGMA busy_timeout = {int(ms)}")  # sql-safe: an int
        if isinstance(conn, _Connection):
            conn.lock_wait_ms = int(ms)


def integrity_problems(conn: sqlite3.Connection) -> list[str]:
    """What is wrong with the file, [] when it is sound.

    PRAGMA quick_check is fast but has been wrong before: SQLite 3.40 reports NULLs that
    are not there in a WITHOUT ROWID table whose key lists its columns out of their order.
    So a gate never refuses on its word alone: what it finds is confirmed by
    PRAGMA integrity_check, the full check, and only what that one reports counts.
    """
    if conn.execute("PRAGMA quick_check").fetchone()[0] == "ok":
        return []
    rows = [row[0] for row in conn.execute("PRAGMA integrity_check")]
    return [] if rows == ["ok"] else rows


def damaged(path: str, problems: list[str]) -> str:
    """One line: what is wrong with the file at `path` and what to do about it."""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return (f"database {path} is damaged: {problems[0]}{more}; stop Tally, move the file"
            " aside and restore the latest backup with `tally restore BACKUP` (README:"
            " Backups); `tally check` lists every problem")


def _probe_write(conn: sqlite3.Connection) -> None:
    """Rewrite user_version inside a rolled-back transaction: fails on a read-only file."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(f"PRAGMA user_version = {version}")  # sql-safe: an int read back from SQLite
    finally:
        conn.execute("ROLLBACK")


def _statements(script: str) -> list[str]:
    """Split schema.sql into statements so it can run inside one transaction."""
    statements, buffer = [], ""
    for line in script.splitlines(keepends=True):
        if not buffer and line.lstrip().startswith("--"):
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    return [s for s in statements if s]


def _interrupted(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code == sqlite3.SQLITE_INTERRUPT if code is not None else "interrupted" in str(exc)


def _storage_error(exc: sqlite3.Error) -> StorageError:
    if is_transient(exc):
        return StorageBusy(str(exc))
    return StorageError(str(exc))
