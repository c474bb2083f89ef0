"""Monthly partitions of events on PostgreSQL (issue 29, part 3): made ahead at start-up
and by a background duty, taking the events of their month (and those that waited in
events_default), dropped whole by `tally prune`, and a version-21 database moved over with
its figures kept. On SQLite the same steps run and nothing is partitioned."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import orjson
import psycopg
import webtest

from app import create_app
from storage.backend import open_database
from storage.events import make_event_months, month_start
from storage.migrations import postgres_version
from tests.conftest import WAIT, FakeClock, bearer, cli_json, config_for, is_postgres, rows
from tests.test_attribution_e2e import UA_PHONE, pageview
from tests.test_maintenance import report

GB, NL = "81.2.69.160", "2.16.6.1"


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def ms(text: str) -> int:
    return int(at(text) * 1000)


def partitions(db: str) -> dict[str, int]:
    """Each partition of events and the rows it holds; {} on SQLite."""
    if not is_postgres(db):
        return {}
    names = [row["relname"] for row in rows(
        db, "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = to_regclass('events') ORDER BY c.relname")]
    # sql-safe: partition names read from the catalog just above
    return {name: rows(db, f"SELECT count(*) AS n FROM {name}")[0]["n"]  # noqa: S608
            for name in names}


def months_task(tally):
    [task] = [task for task in tally.tasks.tasks if "partitions" in task.name]
    return task


class Site:
    """A site of a new account, its key, and events sent through the API and flushed."""

    def __init__(self, tally):
        self.tally = tally
        self.client = webtest.TestApp(tally)
        account = tally.directory.create_account("Parts", "scale")
        self.public_id = tally.directory.create_site(account["id"], ["example.com"])["id"]
        self.key = tally.directory.create_key(self.public_id, ["events", "payments", "read"])["key"]

    def send(self, *events) -> None:
        self.client.post("/api/v1/events", orjson.dumps({"s": self.public_id, "b": list(events)}),
                         headers=bearer(self.key), content_type="application/json", status=204)
        assert self.tally.flusher.flush_now(timeout=WAIT)


def figures(db: str, site: str, first: str, last: str) -> dict:
    return {by: report(db, "traffic", "--site", site, "--from", first, "--to", last, "--by", by)
            for by in ("channel", "page", "device")}


def test_months_made_ahead_take_events_and_prune_drops_a_whole_one(db_path):
    clock = FakeClock(at("2026-09-30T23:00:00"))
    tally = create_app(config_for(db_path), clock=clock)
    try:
        tally.start()  # this month's partition and the next three's, before any flush
        if is_postgres(db_path):
            assert partitions(db_path) == {"events_2026_09": 0, "events_2026_10": 0,
                                           "events_2026_11": 0, "events_2026_12": 0,
                                           "events_default": 0}
        site = Site(tally)
        site.send(pageview(site.public_id, "https://example.com/", "https://www.google.com/", ip=GB),
                  pageview(site.public_id, "https://example.com/pricing", ip=GB),
                  pageview(site.public_id, "https://example.com/", ip=NL, ua=UA_PHONE))
        clock.set(at("2026-10-01T00:30:00"))  # across the month boundary, the duty runs
        months_task(tally).run()
        site.send(pageview(site.public_id, "https://example.com/blog", "https://twitter.com/x", ip=GB),
                  pageview(site.public_id, "https://example.com/", ip=NL, ua=UA_PHONE))
        clock.set(at("2026-10-05T12:00:00"))
        site.send(pageview(site.public_id, "https://example.com/docs", ip=GB),
                  pageview(site.public_id, "https://example.com/", "https://www.bing.com/", ip=NL))
        months_task(tally).run()  # nothing more to make: the months ahead are there
    finally:
        tally.stop(timeout=WAIT)
    if is_postgres(db_path):
        assert partitions(db_path) == {"events_2026_09": 3, "events_2026_10": 4,
                                       "events_2026_11": 0, "events_2026_12": 0,
                                       "events_2027_01": 0, "events_default": 0}
    public_id = site.public_id
    before = figures(db_path, public_id, "2026-09-30", "2026-10-05")
    assert before["channel"]["aggregate"]["pageviews"] == 7

    # September ends before the cut-off: dropped whole; October 1 is deleted row by row.
    result = cli_json("prune", "--before", "2026-10-02", db=db_path)
    assert result["events"] == 5
    assert rows(db_path, "SELECT count(*) AS n FROM events") == [{"n": 2}]
    if is_postgres(db_path):
        assert partitions(db_path) == {"events_2026_10": 2, "events_2026_11": 0,
                                       "events_2026_12": 0, "events_2027_01": 0,
                                       "events_default": 0}
    deleted = rows(db_path, "SELECT month, events FROM deleted_events ORDER BY month")
    assert deleted == [{"month": "2026-09", "events": 3}, {"month": "2026-10", "events": 2}]
    assert cli_json("check", db=db_path)["ok"]  # usage still matches the counted events
    assert figures(db_path, public_id, "2026-09-30", "2026-10-05") == before
    assert cli_json("prune", "--before", "2026-10-02", db=db_path)["events"] == 0

    # A restart on that data: the months ahead of its clock are made, events go on.
    clock = FakeClock(at("2026-11-03T09:00:00"))
    again = create_app(config_for(db_path), clock=clock)
    try:
        again.start()
        largest = rows(db_path, "SELECT max(id) AS id FROM events")[0]["id"]
        client = webtest.TestApp(again)
        client.post("/api/v1/events", orjson.dumps({"s": public_id, "b": [
            pageview(public_id, "https://example.com/", ip=GB)]}), headers=bearer(site.key),
            content_type="application/json", status=204)
        assert again.flusher.flush_now(timeout=WAIT)
    finally:
        again.stop(timeout=WAIT)
    ids = [row["id"] for row in rows(db_path, "SELECT id FROM events ORDER BY id")]
    assert len(ids) == len(set(ids)) == 3 and ids[-1] > largest
    if is_postgres(db_path):
        assert partitions(db_path) == {"events_2026_10": 2, "events_2026_11": 1,
                                       "events_2026_12": 0, "events_2027_01": 0,
                                       "events_2027_02": 0, "events_default": 0}
    assert figures(db_path, public_id, "2026-09-30", "2026-10-05") == before
    assert cli_json("check", db=db_path)["ok"]


def test_events_of_a_month_without_a_partition_wait_in_the_default_one(db_path):
    """Until its month is made (an import, a clock far off); then they move into it, once,
    however many hosts make it at the same time."""
    clock = FakeClock(at("2025-03-10T10:00:00"))
    tally = create_app(config_for(db_path), clock=clock)
    try:  # not started: no partition made
        site = Site(tally)
        site.send(pageview(site.public_id, "https://example.com/", ip=GB),
                  pageview(site.public_id, "https://example.com/a", ip=NL))
    finally:
        tally.stop(timeout=WAIT)
    hosts = [open_database(config_for(db_path)) for _ in range(3)]
    made: list[list[int]] = []
    try:
        threads = [threading.Thread(target=lambda db=db: made.append(
            make_event_months(db, ms("2025-03-10T10:00:00"), ahead=1))) for db in hosts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
    finally:
        for db in hosts:
            db.close()
    if not is_postgres(db_path):
        assert made == [[], [], []]
        return
    march, april = ms("2025-03-01T00:00:00"), ms("2025-04-01T00:00:00")
    assert sorted(month for one in made for month in one) == [march, april]
    assert partitions(db_path) == {"events_2025_03": 2, "events_2025_04": 0, "events_default": 0}
    assert rows(db_path, "SELECT count(*) AS n FROM events WHERE ts >= ? AND ts < ?",
                (march, april)) == [{"n": 2}]


def test_month_start_counts_whole_utc_months():
    assert month_start(ms("2026-12-31T23:59:59")) == ms("2026-12-01T00:00:00")
    assert month_start(ms("2026-12-31T23:59:59"), 1) == ms("2027-01-01T00:00:00")
    assert month_start(ms("2026-03-15T00:00:00"), -3) == ms("2025-12-01T00:00:00")


# Upgrading a version-21 database --------------------------------------------------------

# Version 21's events, as its schema_postgres.sql made it: one table, an identity id.
_TO_VERSION_21 = (
    "CREATE TABLE events_v21 (LIKE events INCLUDING CONSTRAINTS)",
    "ALTER TABLE events_v21 ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY",
    "INSERT INTO events_v21 SELECT * FROM events",
    "DROP TABLE events",
    "ALTER TABLE events_v21 RENAME TO events",
    "ALTER TABLE events ADD PRIMARY KEY (id)",
    "ALTER TABLE events ADD FOREIGN KEY (site_id) REFERENCES sites (id)",
    "CREATE INDEX events_site_ts ON events (site_id, ts)",
    "ALTER SEQUENCE events_v21_id_seq RENAME TO events_id_seq",
    "SELECT setval('events_id_seq', max(id)) FROM events",
    "DROP FUNCTION tally_events_month(bigint)",
    "DROP FUNCTION tally_drop_events_month(bigint)",
    "UPDATE tally_schema_version SET version = 21",
)


def test_a_version_21_database_moves_into_monthly_partitions_with_its_figures(postgres_schema):
    db = postgres_schema
    clock = FakeClock(at("2026-08-20T10:00:00"))
    tally = create_app(config_for(db), clock=clock)
    try:  # not started: every event in events_default, as in an unpartitioned table
        site = Site(tally)
        site.send(pageview(site.public_id, "https://example.com/", "https://www.google.com/", ip=GB))
        clock.set(at("2026-09-02T08:00:00"))
        site.send(pageview(site.public_id, "https://example.com/pricing", ip=GB),
                  pageview(site.public_id, "https://example.com/", ip=NL, ua=UA_PHONE))
        clock.set(at("2026-09-21T15:00:00"))
        site.send(pageview(site.public_id, "https://example.com/blog", "https://twitter.com/x", ip=NL))
        site.client.post("/api/v1/payments", orjson.dumps({
            "payment_id": "pay_1", "amount": 30, "currency": "EUR", "kind": "charge",
            "paid_at": "2026-09-21T15:00:00Z", "customer": {"id": "cus_1"}}),
            headers=bearer(site.key), content_type="application/json", status=200)
    finally:
        tally.stop(timeout=WAIT)
    stored = rows(db, "SELECT * FROM events ORDER BY id")
    assert len(stored) == 4
    before = figures(db, site.public_id, "2026-08-20", "2026-09-21")
    money = report(db, "revenue", "--site", site.public_id, "--from", "2026-08-20",
                   "--to", "2026-09-21")
    assert before["channel"]["aggregate"]["pageviews"] == 4
    with psycopg.connect(db, autocommit=True) as conn:
        for table in ("traffic_day_values", "traffic_day_dimensions", "traffic_days"):
            conn.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed names: count events again
        for statement in _TO_VERSION_21:
            conn.execute(statement)
        assert conn.execute("SELECT relkind::text FROM pg_class WHERE oid = 'events'::regclass"
                            ).fetchone() == ("r",)

    # The next process to open it (here: the reports' CLI) moves it over.
    assert figures(db, site.public_id, "2026-08-20", "2026-09-21") == before
    assert report(db, "revenue", "--site", site.public_id, "--from", "2026-08-20",
                  "--to", "2026-09-21") == money
    assert rows(db, "SELECT version FROM tally_schema_version") == [{"version": postgres_version()}]
    assert rows(db, "SELECT * FROM events ORDER BY id") == stored
    assert partitions(db) == {"events_2026_08": 1, "events_2026_09": 3, "events_default": 0}
    assert rows(db, "SELECT to_regclass('events_before_22') IS NULL AS gone,"
                    " to_regclass('events_id_seq') IS NULL AS old_sequence_gone") == [
        {"gone": True, "old_sequence_gone": True}]

    # Restarted on it: start-up makes the months ahead, new ids follow the old ones.
    clock = FakeClock(at("2026-09-22T10:00:00"))
    again = create_app(config_for(db), clock=clock)
    try:
        again.start()
        webtest.TestApp(again).post(
            "/api/v1/events", orjson.dumps({"s": site.public_id, "b": [
                pageview(site.public_id, "https://example.com/", ip=GB)]}),
            headers=bearer(site.key), content_type="application/json", status=204)
        assert again.flusher.flush_now(timeout=WAIT)
    finally:
        again.stop(timeout=WAIT)
    ids = [row["id"] for row in rows(db, "SELECT id FROM events ORDER BY id")]
    assert ids[:4] == [row["id"] for row in stored] and ids[4] > ids[3]
    assert partitions(db)["events_2026_09"] == 4 and "events_2026_12" in partitions(db)
    assert cli_json("check", db=db)["ok"]


# Upgrading a version-22 database --------------------------------------------------------

# Version 22's foreign keys that version 23 leaves to the flush (schema_postgres.sql,
# "Checked by the flush").
_TO_VERSION_22 = (
    "ALTER TABLE events ADD FOREIGN KEY (site_id) REFERENCES sites (id)",
    "ALTER TABLE sessions ADD FOREIGN KEY (site_id) REFERENCES sites (id)",
    "ALTER TABLE session_visitors ADD FOREIGN KEY (site_id) REFERENCES sites (id)",
    "ALTER TABLE session_visitors ADD FOREIGN KEY (session_id) REFERENCES sessions (id)",
    "UPDATE tally_schema_version SET version = 22",
)
_FLUSH_REFERENCES = (
    "SELECT conrelid::regclass::text AS child, confrelid::regclass::text AS parent"
    " FROM pg_constraint WHERE contype = 'f' AND conrelid::regclass::text IN"
    " ('events', 'sessions', 'session_visitors') OR conrelid IN"
    " (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'events'::regclass) AND contype = 'f'"
    " ORDER BY 1, 2")


def test_a_version_22_database_loses_the_foreign_keys_the_flush_checks(postgres_schema):
    db = postgres_schema
    clock = FakeClock(at("2026-09-02T08:00:00"))
    tally = create_app(config_for(db), clock=clock)
    try:
        tally.start()
        site = Site(tally)
        site.send(pageview(site.public_id, "https://example.com/", "https://www.google.com/", ip=GB),
                  pageview(site.public_id, "https://example.com/pricing", ip=NL, ua=UA_PHONE))
    finally:
        tally.stop(timeout=WAIT)
    before = figures(db, site.public_id, "2026-09-01", "2026-09-02")
    with psycopg.connect(db, autocommit=True) as conn:
        for statement in _TO_VERSION_22:
            conn.execute(statement)
        # events' partitions hold copies of its key
        assert len(conn.execute(_FLUSH_REFERENCES).fetchall()) > 4

    # The next process to open it (here: the reports' CLI) drops them, keeping every row.
    assert figures(db, site.public_id, "2026-09-01", "2026-09-02") == before
    assert rows(db, "SELECT version FROM tally_schema_version") == [{"version": postgres_version()}]
    assert rows(db, _FLUSH_REFERENCES) == []
    assert cli_json("check", db=db)["ok"]

    # Restarted on it: the flush stores into the same tables, and the sessions continue.
    clock.set(at("2026-09-02T08:10:00"))
    again = create_app(config_for(db), clock=clock)
    try:
        again.start()
        site.tally, site.client = again, webtest.TestApp(again)
        site.send(pageview(site.public_id, "https://example.com/blog", ip=GB))
    finally:
        again.stop(timeout=WAIT)
    assert rows(db, "SELECT count(*) AS n, count(DISTINCT session_id) AS sessions FROM events") == [
        {"n": 3, "sessions": 2}]
    assert cli_json("check", db=db)["ok"]
