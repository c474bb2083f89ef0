"""`tally check [--json]`: integrity, and monthly usage against the events stored."""

from __future__ import annotations

import calendar
import sqlite3
import time

import orjson
import pytest

from quota.audit import shift_month as _shift
from storage.backend import open_database
from storage.directory import Directory
from tests.conftest import config_for, execute, is_postgres, rows, run_cli

OCT_1 = calendar.timegm((2026, 10, 1, 0, 0, 0)) * 1000
HOUR, MINUTE = 3_600_000, 60_000


def check(db: str) -> tuple[int, dict]:
    proc = run_cli("check", "--json", db=db, check=False)
    return proc.returncode, orjson.loads(proc.stdout) if proc.stdout else {}


@pytest.fixture
def world(db_path):
    """An account and its site, made through storage: `tally check` is the subject here
    (tests/test_cli.py makes them with the real command)."""
    db = open_database(config_for(db_path))
    try:
        directory = Directory(db, time.time)
        account = directory.create_account("A", "free")
        directory.create_site(account["id"], ["a.test"])
    finally:
        db.close()
    (site,) = rows(db_path, "SELECT id, account_id FROM sites")
    return {"db": db_path, "site": site["id"], "account": site["account_id"],
            "public_account": account["id"]}


def store_events(world, *timestamps: int, name: str = "pageview") -> None:
    for ts in timestamps:
        execute(world["db"], "INSERT INTO events (site_id, ts, name, pathname, url, hostname)"
                             " VALUES (?, ?, ?, ?, ?, ?)",
                (world["site"], ts, name, "/", "https://a.test/", "a.test"))


def set_usage(world, month: str, events: int) -> None:
    execute(world["db"],
            "INSERT INTO monthly_usage (account_id, month, events) VALUES (?, ?, ?)"
            " ON CONFLICT (account_id, month) DO UPDATE SET events = excluded.events",
            (world["account"], month, events))


def test_a_new_database_checks_ok(db_path):
    run_cli("init", db=db_path)
    code, report = check(db_path)
    assert code == 0 and report["ok"] is True and report["integrity"] == "ok"
    assert report["foreign_key_violations"] == 0 and report["usage"]["mismatches"] == []


def test_a_missing_database_is_an_error_not_a_new_file(tmp_path):
    proc = run_cli("check", db=str(tmp_path / "none.db"), check=False)
    assert proc.returncode != 0 and proc.stderr.startswith("tally: no database at")
    assert not (tmp_path / "none.db").exists()


def test_a_schema_without_tally_is_an_error_and_stays_empty(postgres_schema):
    proc = run_cli("check", db=postgres_schema, check=False)
    assert proc.returncode != 0 and proc.stderr.startswith("tally: no database at")
    assert "postgresql://" in proc.stderr
    import psycopg  # rows() would apply the schema

    with psycopg.connect(postgres_schema) as conn:
        assert conn.execute("SELECT count(*) FROM information_schema.tables"
                            " WHERE table_schema = current_schema()").fetchone() == (0,)


def test_matching_usage_checks_ok(world):
    store_events(world, OCT_1 + HOUR, OCT_1 + 2 * HOUR, OCT_1 + 3 * HOUR)
    store_events(world, OCT_1 + HOUR, name="$identify")  # not counted
    store_events(world, OCT_1 - 10 * HOUR)
    set_usage(world, "2026-10", 3)
    set_usage(world, "2026-09", 1)
    code, report = check(world["db"])
    assert code == 0 and report["ok"], report
    assert report["usage"] == {"checked": True, "months": 2, "mismatches": []}


@pytest.mark.parametrize("usage_oct, usage_sep, bad_months", [
    (4, 1, ["2026-10", "all"]),  # one more counted than stored
    (2, 1, ["2026-10", "all"]),  # an event stored but not counted
    (3, 0, ["2026-09", "all"]),  # a month without a usage row
    (2, 2, ["2026-09", "2026-10"]),  # totals agree, months do not
])
def test_a_mismatch_is_reported_and_fails(world, usage_oct, usage_sep, bad_months):
    store_events(world, OCT_1 + HOUR, OCT_1 + 2 * HOUR, OCT_1 + 3 * HOUR, OCT_1 - 10 * HOUR)
    set_usage(world, "2026-10", usage_oct)
    if usage_sep:
        set_usage(world, "2026-09", usage_sep)
    code, report = check(world["db"])
    assert code == 1 and report["ok"] is False
    assert sorted(m["month"] for m in report["usage"]["mismatches"]) == bad_months
    assert {m["account"] for m in report["usage"]["mismatches"]} == {world["public_account"]}


@pytest.mark.parametrize("ts, counted_in", [
    (OCT_1 - 30 * MINUTE, "2026-10"),  # sent at 23:30 with its own ts, received after midnight
    (OCT_1 - 30 * MINUTE, "2026-09"),
    (OCT_1 + 30 * 1000, "2026-09"),  # ts 30 s in the future, received before midnight
])
def test_events_near_a_month_boundary_may_count_in_either_month(world, ts, counted_in):
    store_events(world, ts)
    set_usage(world, counted_in, 1)
    code, report = check(world["db"])
    assert code == 0, report


@pytest.mark.parametrize("ts, counted_in", [
    (OCT_1 - 2 * HOUR, "2026-10"),  # more than an hour before: could not be received in October
    (OCT_1 + 2 * MINUTE, "2026-09"),  # more than a minute ahead: could not be received in September
])
def test_events_far_from_the_boundary_must_count_in_their_month(world, ts, counted_in):
    store_events(world, ts)
    set_usage(world, counted_in, 1)
    code, report = check(world["db"])
    assert code == 1 and report["usage"]["mismatches"]


def test_human_output_lists_mismatches(world):
    store_events(world, OCT_1 + HOUR)
    set_usage(world, "2026-10", 5)
    proc = run_cli("check", db=world["db"], check=False)
    assert proc.returncode == 1
    assert "integrity: ok" in proc.stdout and "usage: 2 mismatches" in proc.stdout
    assert "ACCOUNT" in proc.stdout and "2026-10" in proc.stdout


def test_a_corrupt_database_fails_the_check(db_path):
    run_cli("init", db=db_path)
    if is_postgres(db_path):
        # What PostgreSQL can be left with: an index a failed concurrent build left invalid.
        execute(db_path, "CREATE TABLE filler (x BYTEA)")
        execute(db_path, "INSERT INTO filler SELECT '\\x01'::bytea FROM generate_series(1, 200)")
        with pytest.raises(Exception, match="could not create unique index"):
            execute(db_path, "CREATE UNIQUE INDEX CONCURRENTLY filler_x ON filler (x)")
        proc = run_cli("check", "--json", db=db_path, check=False)
        assert proc.returncode == 1
        report = orjson.loads(proc.stdout)
        assert report["ok"] is False and report["integrity"] == ["index filler_x is invalid"]
        return
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.execute("CREATE TABLE filler (x BLOB)")
    conn.executemany("INSERT INTO filler VALUES (?)", [(b"\x01" * 400,) for _ in range(200)])
    conn.execute("CREATE INDEX filler_x ON filler (x)")
    conn.commit()
    conn.close()
    data = bytearray(open(db_path, "rb").read())
    page = 4096
    data[-3 * page + 200:-3 * page + 1800] = b"\x00" * 1600
    open(db_path, "wb").write(data)
    proc = run_cli("check", "--json", db=db_path, check=False)
    assert proc.returncode == 1
    report = orjson.loads(proc.stdout)
    assert report["ok"] is False
    assert any("missing from index filler_x" in problem for problem in report["integrity"])


def test_a_row_stored_without_its_parent_fails_the_check(db_path):
    run_cli("init", db=db_path)
    orphan = "INSERT INTO sites (id, public_id, account_id, created_at) VALUES (7, 's', 999, 0)"
    if is_postgres(db_path):  # only with triggers off, as a restore with them disabled does
        from storage.postgres import PostgresDatabase

        conn = PostgresDatabase(db_path).connect()
        conn.raw.execute("SET session_replication_role = replica")
    else:
        conn = sqlite3.connect(db_path, isolation_level=None)  # foreign keys off by default
    try:
        conn.execute(orphan)
    finally:
        conn.close()
    code, report = check(db_path)
    assert code == 1 and report["ok"] is False
    assert report["integrity"] == "ok" and report["foreign_key_violations"] == 1


def test_sessions_and_links_of_no_site_or_session_fail_the_check(db_path):
    """On PostgreSQL these references are the flush's to keep (no foreign key: storage/check.py
    FLUSH_CHECKED_REFERENCES); the check counts their orphans as SQLite's foreign keys do."""
    run_cli("init", db=db_path)
    if is_postgres(db_path):
        from storage.postgres import PostgresDatabase

        conn = PostgresDatabase(db_path).connect()
    else:
        conn = sqlite3.connect(db_path, isolation_level=None)  # foreign keys off by default
    try:
        conn.execute("INSERT INTO sessions (id, site_id, visitor_id, started_at, last_seen_at,"
                     " channel) VALUES (5, 999, 1, 0, 0, 'Direct')")
        conn.execute("INSERT INTO session_visitors (site_id, visitor_id, session_id)"
                     " VALUES (999, 1, 5), (999, 1, 6)")
    finally:
        conn.close()
    code, report = check(db_path)
    assert code == 1 and report["ok"] is False
    # sessions -> sites, two links -> sites, one link -> sessions
    assert report["integrity"] == "ok" and report["foreign_key_violations"] == 4


def test_an_unreadable_database_is_one_line_and_non_zero(tmp_path):
    path = tmp_path / "tally.db"
    path.write_bytes(b"not a database " * 512)
    proc = run_cli("check", db=str(path), check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("tally: database") and "file is not a database" in proc.stderr


@pytest.mark.parametrize("month, by, expected", [
    ("2026-01", -1, "2025-12"), ("2026-12", 1, "2027-01"), ("2026-05", 1, "2026-06"),
])
def test_month_shift(month, by, expected):
    assert _shift(month, by) == expected
