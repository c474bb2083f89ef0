"""Tally behind a real PgBouncer (Debian's package) in transaction mode, where a client's
transactions run on whichever server connection is free: no setting Tally makes may stay
on a server connection for the next client (a read budget's statement_timeout, the lock
and JIT settings), and the service ingests, reports and restarts through it.

PgBouncer runs here as this test's own process: its own ini and auth file, a free port,
`pool_mode = transaction` and a pool of POOL_SIZE server connections, so Tally's many
client connections (two workers, their pools, flush threads, payment writers and read
processes) and the test's own clients share two. The database is a new one (PgBouncer
does not pass the URL's `options`, so no search_path names a test schema), dropped after.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
import uuid
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import quote

import orjson
import psycopg
import pytest
import webtest

from app import create_app
from reports.service import too_expensive
from storage.db import ReadBudgetExceeded
from storage.postgres import PostgresDatabase
from storage.statements import native
from tests.conftest import (
    POSTGRES_URL,
    WAIT,
    Server,
    bearer,
    config_for,
    free_port,
    http,
    provision,
    run_cli,
    stop_process,
    wait_until,
)
from tests.realparts import postgres_admin, require
from tests.routes import payment

pytestmark = pytest.mark.slow

POOL_SIZE = 2
# What a client may find on a server connection: each must be the server's own default.
WATCHED = ("statement_timeout", "lock_timeout", "jit", "max_parallel_workers_per_gather",
           "TimeZone")
FOREVER = native("postgres", "SELECT count(*) FROM generate_series(1, 10000000000)")
ONE = native("postgres", "SELECT 1")
DIRECT = "tally-test-direct"  # the application_name of the test's direct connections
BROWSER = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/130.0"


class PgBouncer:
    """A pgbouncer process in front of the test server, for one new database."""

    def __init__(self, stack: ExitStack, pool_size: int = POOL_SIZE):
        self.pool_size = pool_size
        binary = require("pgbouncer", "/usr/sbin/pgbouncer")
        found = re.search(r"PgBouncer (\d+)\.(\d+)", subprocess.run(
            [binary, "--version"], capture_output=True, text=True, check=True).stdout)
        self.version = (int(found[1]), int(found[2]))
        server = psycopg.conninfo.conninfo_to_dict(POSTGRES_URL)
        self.user = server.get("user") or "postgres"
        self.database = f"tally_b_{uuid.uuid4().hex[:12]}"
        admin = postgres_admin()
        admin.execute(f'CREATE DATABASE "{self.database}"')
        stack.callback(self._drop, admin)
        secret = f":{quote(server['password'], safe='')}" if server.get("password") else ""
        self.direct = (f"postgresql://{self.user}{secret}@{server.get('host', '127.0.0.1')}:"
                       f"{server.get('port', '5432')}/{self.database}")
        # Readable by the user pgbouncer runs as: it refuses to run as root.
        self.folder = Path(tempfile.mkdtemp(prefix="tally-pgbouncer-"))
        self.folder.chmod(0o755)
        stack.callback(shutil.rmtree, self.folder, ignore_errors=True)
        (self.folder / "users.txt").write_text(f'"{self.user}" ""\n')
        self.proc: subprocess.Popen | None = None
        stack.callback(self.stop)
        for _ in range(5):  # a port free when asked may be taken before pgbouncer binds it
            self.port = free_port()
            if self._start(binary, server):
                break
        else:
            raise AssertionError(f"pgbouncer did not start: {self.log()}")
        self.url = f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def _start(self, binary: str, server: dict) -> bool:
        ini = self.folder / "pgbouncer.ini"
        password = f" password={server['password']}" if server.get("password") else ""
        ini.write_text(f"""[databases]
* = host={server.get('host', '127.0.0.1')} port={server.get('port', '5432')}{password}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.folder / 'users.txt'}
pool_mode = transaction
default_pool_size = {self.pool_size}
admin_users = {self.user}
max_client_conn = 500
ignore_startup_parameters = options
""")
        for path in self.folder.iterdir():
            path.chmod(0o644)
        as_user = ["-u", "nobody"] if os.geteuid() == 0 else []
        self._log = open(self.folder / "pgbouncer.log", "wb")
        self.proc = subprocess.Popen([binary, *as_user, str(ini)], stdout=self._log,
                                     stderr=subprocess.STDOUT)

        def answers() -> bool:
            if self.proc.poll() is not None:
                return True
            try:
                psycopg.connect(f"postgresql://{self.user}@127.0.0.1:{self.port}/"
                                f"{self.database}", connect_timeout=2).close()
            except psycopg.OperationalError:
                return False
            return True

        assert wait_until(answers, timeout=WAIT), self.log()
        if self.proc.poll() is None:
            return True
        self._log.close()
        return False

    def log(self) -> str:
        return (self.folder / "pgbouncer.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self._log.close()

    def _drop(self, admin) -> None:
        try:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        finally:
            admin.close()

    def server_connections(self) -> int:
        """The database's client backends on the server but the test's direct ones:
        PgBouncer's server connections."""
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                                 " AND backend_type = 'client backend'"
                                 " AND application_name <> %s",
                                 (self.database, DIRECT)).fetchone()[0]

    def waiting_clients(self) -> int:
        """Clients of the database waiting for a server connection (PgBouncer's SHOW POOLS)."""
        with psycopg.connect(f"postgresql://{self.user}@127.0.0.1:{self.port}/pgbouncer",
                             autocommit=True) as console:
            cursor = console.execute("SHOW POOLS")
            names = [column.name for column in cursor.description]
            return sum(dict(zip(names, row, strict=True))["cl_waiting"] for row in cursor
                       if row[names.index("database")] == self.database)

    def env(self) -> dict:
        """Tally's settings behind this PgBouncer: prepared statements need 1.21 or later."""
        return {} if self.version >= (1, 21) else {"TALLY_DATABASE_PREPARED": "off"}


@pytest.fixture
def bouncer():
    with ExitStack() as stack:
        yield PgBouncer(stack)


@pytest.fixture
def one_connection_bouncer():
    """Every client shares one server connection: what one leaves there, the next finds."""
    with ExitStack() as stack:
        yield PgBouncer(stack, pool_size=1)


def server_defaults(bouncer: PgBouncer) -> dict:
    """The settings a new session starts with, on a direct connection."""
    with psycopg.connect(bouncer.direct, autocommit=True, application_name=DIRECT) as conn:
        return {name: conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0]
                for name in WATCHED}


def settings_seen_through(bouncer: PgBouncer) -> dict[int, dict]:
    """What a plain client finds on every server connection of the pool: as many clients
    as the pool has connections, each holding a transaction open, so each is on its own."""
    clients = [psycopg.connect(bouncer.url, autocommit=True) for _ in range(bouncer.pool_size)]
    try:
        seen = {}
        for client in clients:
            client.execute("BEGIN")
            pid = client.execute("SELECT pg_backend_pid()").fetchone()[0]
            seen[pid] = {name: client.execute("SELECT current_setting(%s)", (name,)).fetchone()[0]
                         for name in WATCHED}
        for client in clients:
            client.execute("ROLLBACK")
        return seen
    finally:
        for client in clients:
            client.close()


def assert_nothing_left(bouncer: PgBouncer, defaults: dict) -> None:
    seen = settings_seen_through(bouncer)
    assert len(seen) == bouncer.pool_size  # every server connection of the pool, each once
    left = sorted((name, value, defaults[name]) for settings in seen.values()
                  for name, value in settings.items() if value != defaults[name])
    assert left == [], f"(setting, found, server default) on a pooled connection: {left}"


def test_a_read_budget_never_reaches_another_clients_transaction(one_connection_bouncer):
    """Another client that asks for the one server connection while a budgeted read is
    under way, and after it, finds the server's defaults there; a read past its budget is
    still stopped by the server (statement_timeout, set for the read's own transaction)
    and answered as documented."""
    bouncer = one_connection_bouncer
    defaults = server_defaults(bouncer)
    run_cli("init", db=bouncer.url, env=bouncer.env())
    db = PostgresDatabase(bouncer.url, prepared_statements=False)
    try:
        writer = db.connect()  # a writer's own connection: lock_timeout and jit off
        with db.transaction(writer) as conn:
            assert conn.execute(native("postgres", "SHOW lock_timeout")).fetchone()[0] == "5s"
        seen = []
        other = threading.Thread(target=lambda: seen.append(settings_seen_through(bouncer)))
        with db.read_budget(WAIT):
            assert db.conn().execute(ONE).fetchone()[0] == 1
            other.start()  # it gets the server connection once the read lets it go
            assert wait_until(lambda: not other.is_alive() or bouncer.waiting_clients() > 0)
            assert db.conn().execute(ONE).fetchone()[0] == 1
        db.release()
        other.join(WAIT)
        assert [list(settings.values()) for settings in seen] == [[defaults]]
        with pytest.raises(ReadBudgetExceeded) as stopped:
            with db.read_budget(0.05):
                db.conn().execute(FOREVER).fetchone()
        assert str(stopped.value) == "the read ran past its budget of 0.05 s and was stopped"
        db.release()
        writer.close()
        assert_nothing_left(bouncer, defaults)
    finally:
        db.close()

    account, site, key = provision(bouncer.url, plan="scale", host="example.com",
                                   scopes=("events", "read"))
    tally = create_app(config_for(bouncer.url, read_budget=0.0, read_threads=1,
                                  database_prepared=False))
    try:
        answer = webtest.TestApp(tally).get("/api/v1/stats/aggregate",
                                            headers=bearer(key["key"]), status=422)
        assert answer.json == {"ok": False, "error": {
            "code": "query_too_expensive", "message": too_expensive(0.0)}}
    finally:
        tally.stop(timeout=5)
    assert_nothing_left(bouncer, defaults)


def test_the_service_ingests_reports_and_restarts_through_pgbouncer(bouncer, tmp_path):
    defaults = server_defaults(bouncer)
    run_cli("init", db=bouncer.url, env=bouncer.env())
    account, site, key = provision(bouncer.url, plan="scale", host="example.com",
                                   scopes=("events", "payments", "read"))
    headers = {**bearer(key["key"]), "Content-Type": "application/json"}
    env = {**bouncer.env(), "TALLY_FLUSH_INTERVAL": "0.2"}
    paths = ("/api/v1/stats/aggregate", "/api/v1/stats/breakdown?by=page",
             "/api/v1/stats/timeseries?interval=day")
    with psycopg.connect(bouncer.direct, autocommit=True, application_name=DIRECT) as direct:
        def stored(table: str) -> int:
            return direct.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608 - fixed names

        server = Server(bouncer.url, workers=2, env=env, log_path=tmp_path / "first.log")
        try:
            server.wait_ready()
            pages = [{"e": "pageview", "u": f"https://example.com/p{n % 3}", "ip": f"203.0.113.{n}",
                      "ua": BROWSER} for n in range(30)]
            status, _, text = http("POST", server.url + "/api/v1/events",
                                   orjson.dumps({"s": site["id"], "b": pages}), headers)
            assert status == 204, text
            for number in range(3):
                status, _, text = http("POST", server.url + "/api/v1/payments",
                                       orjson.dumps(payment(f"pay_{number}", f"cus_{number}")),
                                       headers)
                assert status == 200, text
            assert wait_until(lambda: stored("events") == 30), stored("events")
            assert stored("payments") == 3
            served = {}
            for path in paths:
                status, _, body = http("GET", server.url + path, headers=bearer(key["key"]))
                assert status == 200, body
                served[path] = orjson.loads(body)
            assert served[paths[0]]["data"]["visitors"] == 30
            assert served[paths[0]]["data"]["pageviews"] == 30
            # Two workers' connections (pools, flush threads, payment writers, read
            # processes) shared the pool's server connections.
            assert bouncer.server_connections() <= POOL_SIZE
            assert_nothing_left(bouncer, defaults)
        finally:
            assert server.stop() == 0, server.log()

        restarted = Server(bouncer.url, workers=2, env=env, log_path=tmp_path / "second.log")
        try:
            restarted.wait_ready()
            for path in paths:
                status, _, body = http("GET", restarted.url + path, headers=bearer(key["key"]))
                assert status == 200, body
                assert orjson.loads(body) == served[path]
            more = [{"e": "pageview", "u": "https://example.com/later", "ip": "198.51.100.1",
                     "ua": BROWSER}]
            status, _, text = http("POST", restarted.url + "/api/v1/events",
                                   orjson.dumps({"s": site["id"], "b": more}), headers)
            assert status == 204, text
            assert wait_until(lambda: stored("events") == 31), stored("events")
            assert_nothing_left(bouncer, defaults)
        finally:
            assert restarted.stop() == 0, restarted.log()
    assert bouncer.proc.poll() is None  # it served throughout; the fixture ends it
