"""Shared fixtures: a real database (a SQLite file in a temp folder, or a schema of its
own on the test PostgreSQL server), an injectable clock, real processes.

Every test that uses `db_path` (directly or through config, tally, client, ...) runs on
both backends: `db_path` is the SQLite file's path or a postgresql:// URL whose
search_path is the test's own schema, holding Tally's tables and no rows (made for it, or
emptied after an earlier test and renamed: tests/schema_pool.py). Mark a test `sqlite_only`
when what it checks is the SQLite file itself (its upgrades, its backup, its permissions),
and `empty_schema` when it checks what Tally does to an empty PostgreSQL schema."""

from __future__ import annotations

import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest
import webtest
from hypothesis import settings

from app import create_app
from config import Config
from tests.realparts import POSTGRES_URL, postgres_admin
from tests.schema_pool import SchemaPool, schema_url

# make test runs every property test with fixed examples and no deadline, so a shared,
# noisy machine can neither turn up a new example nor time one out; make fuzz
# (FUZZ_EXAMPLES) runs them at random.
settings.register_profile("fixed", derandomize=True, deadline=None, database=None)
settings.register_profile("fuzz", deadline=None)
settings.load_profile("fuzz" if os.environ.get("FUZZ_EXAMPLES") else "fixed")

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


class FakeClock:
    """A settable wall clock, injected wherever the code asks for time."""

    def __init__(self, start: float = 1_790_000_000.0):  # 2026-09-21T14:13:20Z
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def set(self, when: float) -> None:
        self.now = when


def counting_bytes():
    """Deterministic stand-in for secrets.token_bytes."""
    state = {"n": 0}

    def random_bytes(n: int) -> bytes:
        state["n"] += 1
        seed = state["n"].to_bytes(8, "big")
        return (seed * (n // 8 + 1))[:n]

    return random_bytes


BACKENDS = ("sqlite", "postgres")
# Tests in Chromium (marked `browser`) check what the page and the script do; the figures
# they show and the rows they send are checked on both backends by in-process tests. So
# `make test` runs them on SQLite, and `make test-browsers` on both (BROWSER_BACKENDS).
BROWSER_BACKENDS = tuple(os.environ.get("BROWSER_BACKENDS", "sqlite").split())

# The deadline of every wait on a condition (a server up, events stored, a page drawn): a
# loaded machine (`make test-loaded`: twice as many busy processes as cores) is many times
# slower than a quiet one. A condition met early ends the wait at once, so the quiet path
# pays nothing for the room.
WAIT = 120.0


def wait_until(condition, timeout: float = WAIT, interval: float = 0.01) -> bool:
    """Whether `condition()` became true before `timeout` seconds; polls quickly at first,
    then every quarter second at most."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
        interval = min(interval * 1.5, 0.25)


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM,
                 timeout: float = WAIT) -> int:
    """`sig` to a process still running, then its exit status; killed if it outlives
    `timeout` seconds."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def read_head(sock) -> bytes:
    """What a socket gives until an HTTP answer's head has ended (a blank line) or the peer
    closed: the head, and any of the body that came with it."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        piece = sock.recv(65536)
        if not piece:
            break
        answer += piece
    return answer


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "sqlite_only: checks the SQLite file itself; not run on PostgreSQL")
    config.addinivalue_line(
        "markers", "browser: drives headless Chromium; run on BROWSER_BACKENDS (make test: sqlite)")
    config.addinivalue_line(
        "markers", "empty_schema: on PostgreSQL, db_path is a new schema without Tally's"
                   " tables (for a test of what Tally does to an empty database)")


# The tables the catalog churn of a schema per test leaves dead rows in. A server without
# autovacuum (as the project's test server runs) would keep them forever and slow down.
CHURNED_CATALOGS = ("pg_attribute", "pg_class", "pg_type", "pg_depend", "pg_index",
                    "pg_constraint", "pg_trigger", "pg_proc", "pg_attrdef", "pg_namespace",
                    "pg_sequence", "pg_init_privs", "pg_description")


def pytest_sessionfinish(session, exitstatus):
    close_kept_connection()
    if _schema_pool is not None:
        _schema_pool.close()
    if hasattr(session.config, "workerinput"):
        return  # xdist: the controlling process vacuums once, after every worker
    import psycopg

    try:
        with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3) as admin:
            admin.execute(f"VACUUM {', '.join(f'pg_catalog.{t}' for t in CHURNED_CATALOGS)}")
    except psycopg.Error:
        pass  # no server, or not allowed to vacuum the catalogs: nothing to tidy


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        marked = metafunc.definition.get_closest_marker
        backends = (("sqlite",) if marked("sqlite_only") else
                    BROWSER_BACKENDS if marked("browser") else BACKENDS)
        metafunc.parametrize("backend", backends, scope="function")


def pytest_collection_modifyitems(config, items):
    """The slow tests (real servers, browsers, builds) first in each xdist process's share:
    worksteal hands each process a contiguous share and steals from the end of a queue, so
    a run then ends on quick tests that fill the cores instead of one long test alone. The
    order is the same in every process (xdist requires it)."""
    processes = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    slow = [item for item in items if item.get_closest_marker("slow")]
    if processes < 2 or not slow:
        return
    quick = [item for item in items if not item.get_closest_marker("slow")]
    shares = [[] for _ in range(processes)]
    for i, item in enumerate(slow):
        shares[i % processes].append(item)
    remaining = len(items)
    for k, share in enumerate(shares):
        size = remaining // (processes - k)  # xdist's own split of the first hand-out
        remaining -= size
        take = max(0, size - len(share))
        share.extend(quick[:take])
        del quick[:take]
    shares[-1].extend(quick)
    items[:] = [item for share in shares for item in share]


def is_postgres(db: str) -> bool:
    return db.startswith(("postgresql://", "postgres://"))


def latest_version(db: str) -> int:
    """The schema version this release brings `db` to: PostgreSQL's can run ahead of
    schema.sql's (storage.migrations.postgres_version)."""
    from storage.db import schema
    from storage.migrations import postgres_version

    return postgres_version() if is_postgres(db) else schema()[0]


def database_env(db: str) -> dict:
    """The TALLY_ variables that point Tally at `db` (a SQLite path or a PostgreSQL URL)."""
    if is_postgres(db):
        return {"TALLY_DATABASE_URL": db}
    return {"TALLY_DB": db}


def config_for(db: str, **settings) -> Config:
    if is_postgres(db):
        return Config(database_url=db, **settings)
    return Config(db_path=db, **settings)


@contextmanager
def new_postgres_schema():
    """A URL for a new, empty schema on the test server, dropped on leaving."""
    admin = postgres_admin()
    name = f"tally_t_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield schema_url(POSTGRES_URL, name)
    finally:
        try:
            admin.execute("SET lock_timeout = '10s'")
            admin.execute(f'DROP SCHEMA "{name}" CASCADE')
        finally:
            admin.close()


@pytest.fixture
def postgres_schema():
    """A URL for a new, empty schema on the test server, dropped after the test: for tests
    of what Tally does to a schema (creating, upgrading, copying into it)."""
    with new_postgres_schema() as url:
        yield url


_schema_pool: SchemaPool | None = None


@pytest.fixture
def pooled_postgres_schema():
    """A URL for a schema holding Tally's tables and no rows, as `tally init` leaves a new
    one: made for this test, or one an earlier test of this process gave back, emptied and
    renamed (tests/schema_pool.py says how it is kept equal to a new one)."""
    global _schema_pool
    if _schema_pool is None:
        _schema_pool = SchemaPool(POSTGRES_URL, postgres_admin)
    url = _schema_pool.take()
    yield url
    _schema_pool.give_back(url)


@pytest.fixture(scope="module")
def module_database(tmp_path_factory):
    """For worlds made once per module and backend (the `backend` fixture is per test):
    module_database(backend) is a new database of that backend, a SQLite file's path or
    the URL of a PostgreSQL schema dropped after the module."""
    with ExitStack() as stack:
        def database(backend: str) -> str:
            if backend == "postgres":
                return stack.enter_context(new_postgres_schema())
            return str(tmp_path_factory.mktemp("module") / "tally.db")

        yield database


def servers_per_backend(module_database, workers: int):
    """The body of a module-scoped fixture: yields served_on(backend) -> (Server, db), one
    initialised database and one gunicorn of `workers` workers per backend, started when a
    test first asks and stopped after the module. Tests sharing it count only rows of
    their own (their own site, or event names of their own)."""
    started = {}

    def served_on(backend: str):
        if backend not in started:
            db = module_database(backend)
            run_cli("init", db=db)
            started[backend] = (Server(db, workers=workers).wait_ready(), db)
        return started[backend]

    yield served_on
    for server, _ in started.values():
        server.stop()


@pytest.fixture
def db_path(request, backend, tmp_path) -> str:
    """The test's database: a SQLite file's path, or a PostgreSQL URL (see the module doc)."""
    if backend == "postgres":
        if request.node.get_closest_marker("empty_schema") is not None:
            return request.getfixturevalue("postgres_schema")
        return request.getfixturevalue("pooled_postgres_schema")
    return str(tmp_path / "tally.db")


@pytest.fixture(scope="session")
def chromium_process():
    """One headless Chromium for the browser tests of this test process (starting one costs
    about a CPU second); tests take it through `chromium`."""
    from tests.realparts import chromium_driver

    driver = chromium_driver(host_rules="MAP *.test 127.0.0.1")
    yield driver
    driver.quit()


@pytest.fixture
def chromium(chromium_process):
    """This process's Chromium as a new one is: on a blank page, without the cookies, local
    storage or console entries of an earlier test, its window 1280x900, no emulated media, no
    implicit wait. A script a test adds to every new document it removes itself. Ask for it
    after the fixtures of the test's servers: it leaves its page for a blank one before they
    stop."""
    driver = chromium_process
    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.execute_cdp_cmd("Storage.clearDataForOrigin", {"origin": "*",
                                                           "storageTypes": "local_storage"})
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    driver.set_window_size(1280, 900)
    driver.implicitly_wait(0)
    driver.get_log("browser")  # what earlier tests' pages logged
    yield driver
    driver.get("about:blank")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def config(db_path) -> Config:
    return config_for(db_path)


@pytest.fixture
def tally(config, clock):
    app = create_app(config, clock=clock)
    yield app
    app.stop(timeout=5)


@pytest.fixture
def client(tally) -> webtest.TestApp:
    return webtest.TestApp(tally)


@pytest.fixture
def directory(tally):
    return tally.directory


@pytest.fixture
def site(directory):
    """An account on the free plan with one site on example.com and a key of every scope."""
    account = directory.create_account("Example", "free")
    site = directory.create_site(account["id"], ["example.com", "www.example.com"])
    key = directory.create_key(site["id"], ["events", "payments", "read"])
    return {"account": account, "site": site, "key": key["key"], "key_id": key["id"]}


def bearer(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"}


def run_cli(*args: str, db: str, check: bool = True, env: dict | None = None,
            input_text: str | None = None):
    """The real `tally` console script, as an outside user runs it (stdin: input_text)."""
    full_env = {**_without_database(os.environ), **database_env(db), **(env or {})}
    proc = subprocess.run([str(BIN / "tally"), *args], capture_output=True, text=True,
                          env=full_env, cwd=REPO, timeout=WAIT, input=input_text or "")
    if check and proc.returncode != 0:
        raise AssertionError(f"tally {' '.join(args)} failed: {proc.stderr}")
    return proc


def cli_json(*args: str, db: str, env: dict | None = None) -> dict:
    return orjson.loads(run_cli(*args, "--json", db=db, env=env).stdout)


def provision(db: str, *, name: str = "Shop", plan: str = "free", host: str = "shop.example",
              scopes: tuple[str, ...] = ("events",)) -> tuple[dict, dict, dict]:
    """(account, site, key) as `tally account create`, `tally site create` and `tally key
    create --json` print them, made by the same storage.directory calls in this process:
    for tests whose subject is what comes after (a server, a client). Three `tally`
    processes would cost each such test about half a CPU second; tests/test_cli.py runs
    the commands themselves."""
    from storage.backend import open_database
    from storage.directory import Directory

    database = open_database(config_for(db))
    try:
        directory = Directory(database, time.time)
        account = directory.create_account(name, plan)
        site = directory.create_site(account["id"], [host])
        key = directory.create_key(site["id"], scopes)
    finally:
        database.close()
    return account, site, key


def copy_database(source: str, target: str) -> str:
    """A copy of the SQLite file `source` as the database `target` (a path or a URL):
    SQLite's backup, or `tally migrate-to-postgres`'s copy. Returns `target`."""
    if is_postgres(target):
        from storage.db import Database
        from storage.postgres import PostgresDatabase
        from storage.transfer import migrate_to_postgres

        migrate_to_postgres(Database(source), PostgresDatabase(target))
    else:
        with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
            src.backup(dst)
    return target


def _without_database(env) -> dict:
    return {k: v for k, v in env.items() if k not in ("TALLY_DB", "TALLY_DATABASE_URL")}


def rows(db_path: str, sql: str, params=()) -> list[dict]:
    """Read what is stored through a connection of the test's own (SQLite's spelling of
    the statement; on PostgreSQL it is compiled as storage's statements are, or it is
    PostgreSQL's own spelling)."""
    if is_postgres(db_path):
        return _postgres_rows(db_path, sql, params)
    conn = sqlite3.connect(db_path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, params)]
    finally:
        conn.close()


def _spelled(sql: str, conn) -> str:
    """A test's own statement for storage's PostgresConnection: SQLite's spelling where
    storage.statements compiles it, else PostgreSQL's own (a test's CREATE INDEX
    CONCURRENTLY, `::bytea`)."""
    from storage.statements import UnsupportedSQL, postgres_spelling, translate

    if getattr(conn, "dialect", "sqlite") != "postgres":
        return sql
    try:
        translate(sql)
    except UnsupportedSQL:
        return postgres_spelling(sql)
    return sql


def execute(db_path: str, sql: str, params=()) -> int:
    """Run one statement and commit it through a connection of the test's own (SQLite's
    spelling, compiled on PostgreSQL as storage's statements are, or PostgreSQL's own);
    the number of rows it changed."""
    if is_postgres(db_path):
        return _on_kept_connection(
            db_path, lambda conn: conn.execute(_spelled(sql, conn), params).rowcount)
    conn = connect(db_path)
    try:
        return conn.execute(_spelled(sql, conn), params).rowcount
    finally:
        conn.close()


def beside_tally(db: str, ddl: str) -> None:
    """A test's own change to a table (a trigger made or dropped) while a running server
    keeps writing to it: PostgreSQL ends one side of a deadlock between them, and when it
    picks this one the statement runs again (Tally runs its own transaction again too)."""
    from storage.postgres import is_conflict

    deadline = time.monotonic() + WAIT
    while True:
        try:
            execute(db, ddl)
            return
        except Exception as exc:
            if not is_conflict(exc) or time.monotonic() > deadline:
                raise


def fill_postgres_disk(db: str, tables: tuple[str, ...]) -> None:
    """Writes to `tables` fail as PostgreSQL's do when it cannot extend a file (disk_full),
    through triggers: the server's real disk cannot be filled for one schema."""
    execute(db, "CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'"
                " USING ERRCODE = 'disk_full'; END $$")
    for table in tables:
        # sql-safe: table names the test passes, fixed in its code
        beside_tally(db, f"CREATE TRIGGER disk_full BEFORE INSERT OR UPDATE ON {table}"
                         " FOR EACH ROW EXECUTE FUNCTION disk_full()")


def free_postgres_disk(db: str, tables: tuple[str, ...]) -> None:
    for table in tables:
        beside_tally(db, f"DROP TRIGGER disk_full ON {table}")  # sql-safe: as in fill_postgres_disk


@pytest.fixture
def store(db_path):
    """A database with account 1 and site 1, for tests below the HTTP layer."""
    from storage.backend import open_database

    db = open_database(config_for(db_path))
    with db.transaction() as conn:
        conn.execute("INSERT INTO accounts (id, public_id, name, created_at) VALUES (1, 'acct_a', 'A', 0)")
        conn.execute("INSERT INTO sites (id, public_id, account_id, created_at) VALUES (1, 'site_a', 1, 0)")
    yield db
    db.close()


@pytest.fixture
def one_site_db(store):
    """`store` with example.com as site 1's host, for the flush's steps below the HTTP layer."""
    with store.transaction() as conn:
        conn.execute("INSERT INTO site_hosts (site_id, host) VALUES (1, 'example.com')")
    return store


def database_dump(db_path: str) -> str:
    """Everything stored, as text: SQLite's iterdump, or pg_dump of the test's schema."""
    if not is_postgres(db_path):
        conn = sqlite3.connect(db_path)
        try:
            return "\n".join(conn.iterdump())
        finally:
            conn.close()
    schema = rows(db_path, "SELECT current_schema() AS name")[0]["name"]
    return subprocess.run(["pg_dump", f"--schema={schema}", f"--dbname={db_path}"],
                          check=True, capture_output=True, text=True, timeout=WAIT).stdout


def _postgres_rows(url: str, sql: str, params) -> list[dict]:
    def read(conn) -> list[dict]:
        cursor = conn.execute(_spelled(sql, conn), params)
        names = [column.name for column in cursor.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    return _on_kept_connection(url, read)


# rows() and execute() run hundreds of times in some tests (a wait polls every tenth of a
# second). A new PostgreSQL connection for each cost this process ~2 ms and the server more
# (a backend started, Tally's schema checked): the main thread of each test process keeps
# one autocommit connection, to the database it last asked, instead. It holds no lock
# between statements; one the server ended (tests of failover end every connection to a
# schema, DROP DATABASE ... WITH (FORCE) ends those to a restored copy) is replaced.
_kept = threading.local()


def _on_kept_connection(url: str, work):
    from storage.postgres import PostgresDatabase

    if threading.current_thread() is not threading.main_thread():
        conn = PostgresDatabase(url).connect()
        try:
            return work(conn)
        finally:
            conn.close()
    kept = getattr(_kept, "conn", None)
    if kept is not None and (kept[0] != url or kept[1] != os.getpid() or kept[2].closed):
        if kept[1] == os.getpid():
            _close_quietly(kept[2])
        kept = _kept.conn = None
    reused = kept is not None
    if not reused:
        kept = _kept.conn = (url, os.getpid(), PostgresDatabase(url).connect())
    conn = kept[2]
    try:
        return work(conn)
    except Exception:
        if not (reused and conn.closed):
            raise
        _kept.conn = None  # ended by the server while it was kept: run it on a new one
        return _on_kept_connection(url, work)


def _close_quietly(conn) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - a connection the server already ended
        pass


def close_kept_connection() -> None:
    kept = getattr(_kept, "conn", None)
    _kept.conn = None
    if kept is not None and kept[1] == os.getpid():
        _close_quietly(kept[2])


def connect(db: str):
    """A connection of the test's own, in autocommit, for reads and writes around Tally:
    sqlite3's, or storage's PostgresConnection (SQLite's spelling translated)."""
    if is_postgres(db):
        from storage.postgres import PostgresDatabase

        return PostgresDatabase(db).connect()
    return sqlite3.connect(db, isolation_level=None)


def delete_unchecked(db: str, *tables: str) -> None:
    """Delete every row of `tables` with foreign keys unchecked, as a hand going around
    Tally would: rows that refer to them are left dangling."""
    conn = connect(db)
    try:
        if is_postgres(db):
            conn.execute("BEGIN")
            conn.raw.execute("SET LOCAL session_replication_role = replica")
        else:
            conn.execute("PRAGMA foreign_keys = OFF")
            conn.execute("BEGIN")
        for table in tables:
            conn.execute(f"DELETE FROM {table}")  # noqa: S608 - a test's own table names
        conn.execute("COMMIT")
    finally:
        conn.close()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


# A port the kernel picks for bind(0) is one it may give the next outgoing connection or
# another test process's bind(0) before the test's server binds it. Ports are taken
# instead below the kernel's ephemeral range, in a block of their own for each xdist
# process, from a random start (another run on the machine draws from the same blocks).
PORT_BLOCK = 1000
_PORT_BASE = 20000
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
_XDIST_INDEX = int(_XDIST_WORKER) if _XDIST_WORKER.isdigit() else 0
_next_port = [random.randrange(PORT_BLOCK)]
_ports_lock = threading.Lock()


def free_port() -> int:
    """A port on 127.0.0.1 nothing holds now, from this test process's own block."""
    first = _PORT_BASE + _XDIST_INDEX * PORT_BLOCK
    if first + PORT_BLOCK > _ephemeral_low():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    with _ports_lock:
        for _ in range(PORT_BLOCK):
            port = first + _next_port[0] % PORT_BLOCK
            _next_port[0] += 1
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise OSError(f"no free port in {first}-{first + PORT_BLOCK - 1}")


# A test's server reads within WAIT, not the service's default budget (config.READ_BUDGET):
# on a loaded machine a report can take longer than that, and no test asserts the default
# (tests/test_read_budget.py sets its own). A test passes TALLY_READ_BUDGET to change it.
SERVER_ENV = {"TALLY_READ_BUDGET": str(WAIT)}


class Server:
    """A real gunicorn serving app:app from the repo root, with gunicorn.conf.py."""

    # A free port is free when asked, not when gunicorn binds it: another test process's
    # server can take it in between. That server then answers this one's /healthz (it once
    # answered a client test's events 401, its key unknown there), so readiness is this
    # gunicorn holding the port's listening socket, and a port taken first means a new one.
    PORT_TRIES = 5

    def __init__(self, db: str, workers: int = 2, env: dict | None = None,
                 log_path: Path | None = None, app: str = "app:app"):
        self.db = db
        self._command = (workers, app, {**_without_database(os.environ), **SERVER_ENV,
                                        **database_env(db), **(env or {})})
        self.port = free_port()
        if log_path is None:
            folder = Path(tempfile.mkdtemp(prefix="tally-server-")) if is_postgres(db) else Path(db).parent
            log_path = folder / f"gunicorn-{self.port}.log"
        self.log_path = log_path
        self._start("wb")

    def _start(self, mode: str = "ab") -> None:
        workers, app, env = self._command
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(self.log_path, mode)
        self.proc = subprocess.Popen(
            [str(BIN / "gunicorn"), "--bind", f"127.0.0.1:{self.port}", "--workers", str(workers),
             app],
            cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def holds_port(self) -> bool:
        """Whether this server's gunicorn (its master) holds the listening socket of its port."""
        try:
            folder = f"/proc/{self.proc.pid}/fd"
            sockets = {target[8:-1] for target in (os.readlink(f"{folder}/{fd}")
                                                   for fd in os.listdir(folder))
                       if target.startswith("socket:[")}
            with open("/proc/net/tcp") as table:
                lines = table.readlines()[1:]
        except OSError:
            return False
        port = f":{self.port:04X}"
        return any(fields[1].endswith(port) and fields[3] == "0A" and fields[9] in sockets
                   for fields in (line.split() for line in lines))

    def wait_ready(self, timeout: float = WAIT) -> Server:
        import urllib.request

        tries = self.PORT_TRIES

        def answers() -> bool:
            nonlocal tries
            if self.proc.poll() is not None:
                tries -= 1
                if tries and "Connection in use" in self.log():
                    self._log.close()
                    self.port = free_port()
                    self._start()
                    return False
                raise AssertionError(f"gunicorn exited: {self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=10) as resp:
                    return resp.status == 200 and self.holds_port()
            except OSError:
                return False

        if not wait_until(answers, timeout):
            raise AssertionError(f"gunicorn not ready after {timeout:g} s: {self.log()}")
        return self

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = WAIT) -> int:
        status = stop_process(self.proc, sig, timeout)
        self._log.close()
        return status


@pytest.fixture
def server_factory(tmp_path):
    servers = []

    def start(db: str, workers: int = 2, env: dict | None = None, app: str = "app:app") -> Server:
        log_path = tmp_path / f"gunicorn-{len(servers)}.log"
        server = Server(db, workers, env, log_path=log_path, app=app).wait_ready()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None):
    """One plain HTTP request; returns (status, case-insensitive headers, body bytes)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()



class WriteLock:
    """Holds the database's write lock, as another writer would: SQLite's BEGIN IMMEDIATE
    on a connection of its own, PostgreSQL's writer lock (storage/postgres.py). `turn`:
    on SQLite, first the write turn too, as a Tally writer of another process holds it
    (storage.db.WRITE_TURN_SUFFIX); without it, as a writer outside Tally."""

    def __init__(self, db: str, *, turn: bool = False):
        self.turn = None
        if is_postgres(db):
            from storage.postgres import PostgresDatabase

            self.conn = PostgresDatabase(db).connect()
        else:
            if turn:
                import fcntl

                from storage.db import WRITE_TURN_SUFFIX

                self.turn = os.open(db + WRITE_TURN_SUFFIX, os.O_RDWR | os.O_CREAT)
                fcntl.flock(self.turn, fcntl.LOCK_EX)
            self.conn = sqlite3.connect(db, isolation_level=None)
        self.conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        if self.conn is not None:
            self.conn.execute("ROLLBACK")
            self.conn.close()
            self.conn = None
        if self.turn is not None:
            os.close(self.turn)  # gives the turn back
            self.turn = None


@pytest.fixture
def restore_backup():
    """restore(db, backup) -> a database holding what `tally backup` wrote of db: the copy
    itself on SQLite; on PostgreSQL a new database pg_restore fills from the archive, as
    README's restore does (the same schema name; dropped after the test)."""
    created = []

    def restore(db: str, backup) -> str:
        if not is_postgres(db):
            return str(backup)
        name = f"tally_r_{uuid.uuid4().hex[:12]}"
        admin = postgres_admin()
        try:
            admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            admin.close()
        created.append(name)
        url = urlsplit(db)._replace(path=f"/{name}").geturl()
        subprocess.run(["pg_restore", "--clean", "--if-exists", "--exit-on-error",
                        "--single-transaction", f"--dbname={url}", str(backup)],
                       check=True, capture_output=True, timeout=120)
        return url

    yield restore
    if created:
        admin = postgres_admin()
        try:
            for name in created:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            admin.close()
