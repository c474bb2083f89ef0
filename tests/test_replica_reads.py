"""Issue 29, reports from a replica: with TALLY_DATABASE_READ_URL, the Stats API, the
dashboard and shared links read from a real streaming replica of the test server
(tests/replica.py), fall back to the primary when the replica stops or lags past
TALLY_REPLICA_MAX_LAG, and store final days on the primary.

Where a read came from shows in what it counts: while the replica's replay is paused
(pg_wal_replay_pause) it holds fewer visitors than the primary.

Making a replica needs pg_basebackup, pg_ctl, root or the postgres user, and a test
server that allows replication from 127.0.0.1 (tests/replica.py). Without them the tests
are skipped with the reason, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import orjson
import psycopg
import pytest
import webtest

from app import create_app
from config import Config, ConfigError
from dashboard.passwords import hash_password
from storage.shares import SharedLinks
from storage.users import Users
from tests import dashboard_seed as seed
from tests.conftest import REPO, WAIT, FakeClock, bearer, rows, wait_until
from tests.realparts import POSTGRES_URL
from tests.replica import (
    SLOT_PREFIX,
    ReplicaUnavailable,
    drop_forgotten_slots,
    stop_forgotten_replicas,
    streaming_replica,
    wait_replayed,
)

DAY = 86_400


@pytest.fixture(scope="module")
def replica():
    try:
        with streaming_replica(POSTGRES_URL) as made:
            yield made
    except ReplicaUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no streaming replica of the test server under CI: {exc}")
        pytest.skip(f"SKIPPED LOUDLY: no streaming replica of the test server here: {exc}")


class Site:
    """An account, its site, key, user and shared link, the site's seeded traffic, and
    Tallys reading from the replica (made in-process: the CLI is tested elsewhere)."""

    def __init__(self, db: str, replica):
        self.db = db
        self.replica = replica
        self.clock = FakeClock()
        self.apps = []
        self.tally = self.app(max_lag=3600)
        directory, clock = self.tally.directory, self.clock
        account = directory.create_account("Account A", "growth")
        site = directory.create_site(account["id"], ["shop.test"])
        key = directory.create_key(site["id"], ["events", "payments", "read"])
        self.site = {"account": account["id"], "site": site["id"], "key": key["key"],
                     "email": "owner-a@example.com"}
        Users(self.tally.db, clock).create_user(
            self.site["email"], hash_password(seed.PASSWORD), [account["id"]])
        seed.traffic(self.tally, self.site, clock(), clock.advance)
        self.share = "/share/" + SharedLinks(self.tally.db, clock).create(
            site["id"], revenue=False)["token"]
        self.visits = 0

    def app(self, max_lag: float):
        tally = create_app(Config(database_url=self.db,
                                  database_read_url=self.replica.url_for(self.db),
                                  replica_max_lag=max_lag), clock=self.clock)
        tally.start()
        self.apps.append(tally)
        return tally

    def stop(self):
        for tally in self.apps:
            tally.stop(timeout=5)
        self.apps = []

    def visit(self, tally=None):
        """One more visitor on site a, stored on the primary."""
        self.visits += 1
        event = {"s": self.site["site"], "e": "pageview", "u": "https://shop.test/new",
                 "ip": f"198.51.100.{self.visits}", "ua": seed.UA}
        tally = tally or self.tally
        webtest.TestApp(tally).post(
            "/api/v1/events", orjson.dumps(event), status=204,
            headers={**bearer(self.site["key"]), "Content-Type": "application/json"})
        assert tally.flusher.flush_now(timeout=WAIT)

    def visitors(self, tally=None, query: str = "") -> int:
        client = webtest.TestApp(tally or self.tally)
        answer = client.get(f"/api/v1/stats/aggregate{query}", headers=bearer(self.site["key"]))
        return orjson.loads(answer.body)["data"]["visitors"]

    def shared_visitors(self, tally=None) -> int:
        page = webtest.TestApp(tally or self.tally).get(self.share + "?period=7d")
        return int(_metrics(page)["visitors"])

    def dashboard_visitors(self, tally=None) -> int:
        client = webtest.TestApp(tally or self.tally)
        form = client.get("/login").forms[0]
        form["email"], form["password"] = self.site["email"], seed.PASSWORD
        form.submit(status=303, extra_environ={"REMOTE_ADDR": "192.0.2.10"})
        page = client.get(f"/sites/{self.site['site']}?period=7d")
        return int(_metrics(page)["visitors"])


def _metrics(page) -> dict[str, str]:
    return dict(re.findall(r'data-metric="([a-z_]+)" data-value="([^"]*)"', page.text))


@pytest.fixture
def site(replica, pooled_postgres_schema):
    made = Site(pooled_postgres_schema, replica)
    wait_replayed(POSTGRES_URL, replica)
    try:
        yield made
    finally:
        made.stop()
        replica.resume_replay()


def test_reports_dashboard_and_shared_links_read_the_replica_and_store_on_the_primary(
        site, replica):
    assert site.visitors() == site.shared_visitors() == site.dashboard_visitors() == 6
    # The service's checks remember the primary's positions they read. The suite's other
    # processes write to the primary meanwhile, so a check may have come while replay was
    # short of the position it read (the verdict "behind" then holds for CHECK_INTERVAL);
    # replay passes every position read so far before it stops, so the next check finds
    # the replica current.
    wait_replayed(POSTGRES_URL, replica)

    replica.pause_replay()
    site.visit()  # stored on the primary, not yet replayed on the replica
    assert rows(site.db, "SELECT count(DISTINCT visitor_id) AS n FROM events")[0]["n"] == 7
    # Within TALLY_REPLICA_MAX_LAG (an hour here), every read is the replica's.
    assert wait_until(lambda: site.visitors() == 6)
    assert site.visitors() == site.shared_visitors() == site.dashboard_visitors() == 6
    # With a bound the paused replica is past, the same reads are the primary's.
    strict = site.app(max_lag=0.5)
    assert wait_until(lambda: site.visitors(strict) == 7)
    assert site.shared_visitors(strict) == site.dashboard_visitors(strict) == 7

    replica.resume_replay()
    wait_replayed(POSTGRES_URL, replica)
    assert site.visitors() == 7

    # Days long past are final: the report read on the replica stores them on the primary.
    site.clock.advance(3 * DAY)
    assert site.visitors() == 7
    assert rows(site.db, "SELECT count(*) AS n FROM traffic_days")[0]["n"] >= 1

    # A restarted service on the same data answers the same.
    site.stop()
    assert site.visitors(site.app(max_lag=3600)) == 7


def test_a_stopped_replica_sends_reads_to_the_primary_until_it_is_back(site, replica):
    assert site.visitors() == 6
    replica.stop()
    try:
        site.visit()
        # The replica is gone: reads are answered, from the primary.
        assert site.visitors() == site.shared_visitors() == site.dashboard_visitors() == 7
    finally:
        replica.start()
    wait_replayed(POSTGRES_URL, replica)
    replica.pause_replay()
    site.visit()
    # Back on the replica once it answers again (it is tried again after a few seconds).
    assert wait_until(lambda: site.visitors() == 7)
    assert site.visitors() == 7 and rows(
        site.db, "SELECT count(DISTINCT visitor_id) AS n FROM events")[0]["n"] == 8


def test_a_lagging_replica_sends_reads_to_the_primary(site, replica):
    tally = site.app(max_lag=1)
    assert site.visitors(tally) == 6  # the replica is current: it answers
    replica.pause_replay()
    site.visit(tally)
    # Past the bound, the primary answers, with the visitor the replica has not replayed.
    assert wait_until(lambda: site.visitors(tally) == 7)
    replica.resume_replay()
    wait_replayed(POSTGRES_URL, replica)
    assert site.visitors(tally) == 7


def test_the_first_read_of_a_new_service_reads_the_replica(site, replica):
    # The suite's other processes write to the same primary: a first check that comes
    # after one of their writes finds the replica short of the primary's newest position,
    # with no older position seen yet, and rightly reads the primary. So a new service is
    # made until its first check comes while the replica holds all the primary does.
    services = []

    def first_check_reads_the_replica() -> bool:
        if services:
            site.apps.remove(services[-1])
            services[-1].stop(timeout=5)
        services.append(site.app(max_lag=3600))
        # Once the replica has replayed what the primary holds now (the new service's
        # start wrote to it), the replica is within the bound from here on.
        wait_replayed(POSTGRES_URL, replica)
        return services[-1].db.replica.usable(services[-1].db._primary_position)

    assert wait_until(first_check_reads_the_replica)
    tally = services[-1]
    replica.pause_replay()
    site.visit(tally)
    assert site.visitors(tally) == 6  # the read thread's first read, on the replica


def test_a_replica_stopped_while_the_primary_recycles_its_wal_catches_up(replica):
    # The rest of the suite writes while a replica is stopped: checkpoints on the primary
    # then recycle the WAL the replica has not received, unless its slot holds it.
    replica.stop()
    try:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            for _ in range(2):
                admin.execute("SELECT pg_switch_wal()")
                admin.execute("CHECKPOINT")
    finally:
        replica.start()
    wait_replayed(POSTGRES_URL, replica)


def test_a_slot_left_by_a_test_process_that_died_is_dropped_and_a_live_ones_kept(replica):
    dead = _ended_pid()
    names = (f"{SLOT_PREFIX}{dead}_aaaaaa", f"{SLOT_PREFIX}{os.getpid()}_bbbbbb")
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        for name in names:
            admin.execute("SELECT pg_create_physical_replication_slot(%s)", (name,))
        try:
            assert drop_forgotten_slots(admin) == [names[0]]
        finally:
            admin.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                          " WHERE slot_name = ANY(%s)", (list(names),))


FORGOTTEN_REPLICA = """
import sys, time
from tests.replica import streaming_replica
with streaming_replica(sys.argv[1]) as replica:
    print(replica.folder, replica.port, flush=True)
    time.sleep(3600)
"""


@pytest.mark.slow
def test_a_replica_left_by_a_killed_test_process_is_stopped_and_its_slot_dropped(replica):
    """A test process killed before its cleanup ran (SIGKILL, a `timeout`) leaves its
    replica running and its slot active; the next replica made stops and removes it, and
    then drops its slot."""
    child = subprocess.Popen([sys.executable, "-c", FORGOTTEN_REPLICA, POSTGRES_URL],
                             cwd=REPO, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    slot_of_child = f"{SLOT_PREFIX}{child.pid}_%"

    def running(port: int) -> bool:
        try:
            psycopg.connect(host="127.0.0.1", port=port, user="postgres",
                            dbname="postgres", connect_timeout=5).close()
        except psycopg.OperationalError:
            return False
        return True

    def slots() -> list[tuple[str, bool]]:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            return admin.execute("SELECT slot_name, active FROM pg_replication_slots"
                                 " WHERE slot_name LIKE %s", (slot_of_child,)).fetchall()

    try:
        folder, port = child.stdout.readline().split()
        assert running(int(port)) and [active for _, active in slots()] == [True]
    finally:
        child.kill()  # its cleanup never runs: the replica is left running
        child.wait(WAIT)
    stop_forgotten_replicas()  # as the next replica made does first
    # (another test process making a replica meanwhile may have done it already)
    assert not os.path.exists(folder) and not running(int(port))
    assert wait_until(lambda: not any(active for _, active in slots()))  # WAL sender let go
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        drop_forgotten_slots(admin)
    assert slots() == []


def _ended_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("environ, message", [
    ({"TALLY_DATABASE_READ_URL": "postgresql://replica/tally"},
     "TALLY_DATABASE_READ_URL needs TALLY_DATABASE_URL"),
    ({"TALLY_DATABASE_URL": "postgresql://db/tally", "TALLY_DATABASE_READ_URL": "replica"},
     "TALLY_DATABASE_READ_URL must be a postgresql:// URL"),
    ({"TALLY_DATABASE_URL": "postgresql://db/tally", "TALLY_REPLICA_MAX_LAG": "0"},
     "TALLY_REPLICA_MAX_LAG must be between 0 and 3600 seconds"),
])
def test_the_replica_settings_are_checked(environ, message):
    with pytest.raises(ConfigError, match=message):
        Config.from_env(environ)


def test_a_sqlite_tally_reads_its_file_as_before(tmp_path):
    """Without a PostgreSQL URL there is no replica: reads run on the file, as always."""
    config = Config.from_env({"TALLY_DB": str(tmp_path / "tally.db")})
    assert config.database_read_url is None and config.replica_max_lag == 10
    tally = create_app(config)
    try:
        assert tally.reads.run(lambda: tally.db.conn().execute("SELECT 1").fetchone()[0]) == 1
    finally:
        tally.stop(timeout=5)
