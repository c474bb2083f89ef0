"""`tally backup`, `tally prune` (and TALLY_RETENTION_DAYS), `tally customer erase` and
`tally visitor erase` on a real SQLite file through the real CLI."""

from __future__ import annotations

import contextlib
import io
import sqlite3

import orjson
import pytest

from reports.days.queries import DIMENSIONS
from tests.conftest import (
    WAIT,
    bearer,
    cli_json,
    config_for,
    execute,
    is_postgres,
    latest_version,
    rows,
    run_cli,
)
from tests.test_attribution_e2e import UA, UA_PHONE, identify, pageview

DAYS = ("2026-09-21", "2026-09-22", "2026-09-23")
DAY_S = 86_400
GB, NL = "81.2.69.160", "2.16.6.1"


@pytest.fixture
def history(client, tally, site, clock, db_path):
    """Three UTC days of traffic and a customer who came from Google on the first."""
    headers = bearer(site["key"])
    site_id = site["site"]["id"]
    tally.start()

    def send(*events):
        client.post_json("/api/v1/events", {"s": site_id, "b": list(events)}, headers=headers,
                         status=204)
        clock.advance(60)

    send(pageview(site_id, "https://example.com/", "https://www.google.com/", ip=GB),
         pageview(site_id, "https://example.com/pricing", ip=GB),
         identify(site_id, "user-1", ip=GB),
         pageview(site_id, "https://example.com/", ip=NL, ua=UA_PHONE))
    client.post_json("/api/v1/payments", {
        "payment_id": "pay_1", "amount": 30, "currency": "EUR", "kind": "charge",
        "paid_at": "2026-09-21T15:00:00Z",
        "customer": {"id": "cus_1", "email": "ada@example.com", "name": "Ada", "user_id": "user-1",
                     "country": "GB", "metadata": {"tier": "gold"}},
        "metadata": {"order": "A-1"},
        "subscription": {"id": "sub_1", "plan": "Pro", "interval": "month", "amount": 30}},
        headers=headers, status=200)
    clock.advance(DAY_S)
    send(pageview(site_id, "https://example.com/blog", "https://twitter.com/x", ip=GB, ua=UA_PHONE),
         {"s": site_id, "e": "signup", "u": "https://example.com/blog", "ip": GB, "ua": UA_PHONE,
          "uid": "user-1"})
    clock.advance(DAY_S)
    send(pageview(site_id, "https://example.com/", ip=NL))
    assert tally.flusher.flush_now(timeout=WAIT)
    tally.stop(timeout=10)
    return {"site": site_id, "db": db_path}


def report(db, *args) -> dict:
    """`tally report ... --json`, run by the CLI's own main in this process: the figures
    these tests compare before and after would otherwise start some thirty processes (the
    console script's reports are tested in tests/test_reports_csv.py)."""
    from cli import Context, main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    context = Context(config_for(db))
    try:
        with contextlib.redirect_stdout(out):
            assert main(["report", *args, "--json"], context=context) == 0
        out.flush()
        return orjson.loads(out.buffer.getvalue())
    finally:
        context.db.close()


def traffic(db, site, by="channel"):
    data = report(db, "traffic", "--site", site, "--from", DAYS[0], "--to", DAYS[2], "--by", by)
    return data["aggregate"], data["breakdown"]


def revenue(db, site):
    return report(db, "revenue", "--site", site, "--from", DAYS[0], "--to", DAYS[2])


def count(db, table, where="1 = 1", params=()):
    return rows(db, f"SELECT count(*) AS n FROM {table} WHERE {where}", params)[0]["n"]  # noqa: S608  # sql-safe: table and condition are literals of these tests, values are parameters


# Backups -------------------------------------------------------------------------------

def test_backup_copies_and_checks(history, tmp_path, restore_backup):
    db = history["db"]
    copy = tmp_path / "copy.db"
    result = cli_json("backup", str(copy), db=db)
    assert result["integrity"] == "ok" and result["bytes"] == copy.stat().st_size > 0
    assert result["user_version"] == latest_version(db)
    assert not (tmp_path / "copy.db-wal").exists()
    assert not (tmp_path / "copy.db.partial").exists()
    restored = restore_backup(db, copy)
    for table in ("events", "sessions", "payments", "customers", "subscriptions"):
        assert count(restored, table) == count(db, table), table
    assert cli_json("check", db=restored)["ok"]
    again = run_cli("backup", str(copy), db=db, check=False)
    assert again.returncode == 1 and "already exists" in again.stderr
    missing = run_cli("backup", str(tmp_path / "no" / "copy.db"), db=db, check=False)
    assert missing.returncode == 1 and "no folder" in missing.stderr
    if is_postgres(db):
        (tmp_path / "bin").mkdir()
        without = run_cli("backup", str(tmp_path / "other.dump"), db=db, check=False,
                          env={"PATH": str(tmp_path / "bin")})
        assert without.returncode == 1
        assert "pg_dump and pg_restore not found" in without.stderr
        assert not (tmp_path / "other.dump").exists()


# Retention -----------------------------------------------------------------------------

def test_prune_keeps_report_figures_and_money(history):
    db, site = history["db"], history["site"]
    before = {by: traffic(db, site, by) for by in DIMENSIONS}
    money = revenue(db, site)
    assert money["currencies"]["EUR"]["by_channel"][0]["channel"] == "Organic Search"
    assert before["channel"][0]["pageviews"] == 5 and before["channel"][0]["visitors"] == 4
    # The reports above stored the final days; prune must store any it finds missing.
    for table in ("traffic_day_values", "traffic_day_dimensions", "traffic_days"):
        execute(db, f"DELETE FROM {table}")  # noqa: S608 - fixed names
    kept_tables = {t: count(db, t) for t in ("payments", "customers", "subscriptions",
                                             "subscription_observations", "monthly_usage")}

    result = cli_json("prune", "--before", DAYS[2], db=db)
    assert result["before"] == DAYS[2]
    assert result["events"] == 6 and result["sessions"] == 2 and result["kept_sessions"] == 1
    assert count(db, "events") == 1  # the third day's
    # The first-touch session of the paying customer is kept: revenue keeps its channel.
    assert count(db, "sessions") == 2
    assert {t: count(db, t) for t in kept_tables} == kept_tables
    assert {by: traffic(db, site, by) for by in DIMENSIONS} == before
    assert revenue(db, site) == money
    assert cli_json("check", db=db)["ok"]
    # Again: nothing left to delete, same figures.
    assert cli_json("prune", "--before", DAYS[2], db=db)["events"] == 0
    assert {by: traffic(db, site, by) for by in DIMENSIONS} == before


def test_prune_refuses_days_that_can_still_change(history):
    proc = run_cli("prune", "--before", "2999-01-01", db=history["db"], check=False)
    assert proc.returncode == 1 and "or earlier" in proc.stderr
    proc = run_cli("prune", db=history["db"], check=False)
    assert proc.returncode == 1 and "TALLY_RETENTION_DAYS" in proc.stderr
    assert count(history["db"], "events") == 7


def test_retention_days_prunes_everything_older(history):
    db = history["db"]
    result = cli_json("prune", db=db, env={"TALLY_RETENTION_DAYS": "1"})
    assert result["events"] == 7
    assert count(db, "events") == 0
    assert count(db, "sessions") == 1  # the customer's first touch
    aggregate = traffic(db, history["site"])[0]
    assert aggregate["pageviews"] == 5


# Erasure -------------------------------------------------------------------------------

def test_customer_erase_clears_personal_data_and_keeps_revenue(history):
    db, site = history["db"], history["site"]
    money = revenue(db, site)
    mrr = cli_json("report", "mrr", "--site", site, "--at", DAYS[2], db=db)
    assert count(db, "visitor_identities") == 1 and count(db, "events", "uid = 'user-1'") == 2

    result = cli_json("customer", "erase", "--site", site, "--customer", "cus_1", db=db)
    assert result["identity_links"] == 1 and result["events_user_id_cleared"] == 2
    customer = rows(db, "SELECT * FROM customers")[0]
    assert [customer[f] for f in ("email", "name", "metadata", "user_id", "visitor_id")] == [None] * 5
    assert customer["customer_id"] == "cus_1" and customer["country"] == "GB"
    assert count(db, "visitor_identities") == 0
    assert count(db, "events", "uid IS NOT NULL") == 0
    assert revenue(db, site) == money
    assert cli_json("report", "mrr", "--site", site, "--at", DAYS[2], db=db) == mrr
    assert cli_json("check", db=db)["ok"]
    dump = "\n".join(str(r) for t in ("customers", "events", "visitor_identities", "sessions")
                     for r in rows(db, f"SELECT * FROM {t}"))  # noqa: S608 - fixed names
    assert "ada@example.com" not in dump and "user-1" not in dump and "gold" not in dump

    missing = run_cli("customer", "erase", "--site", site, "--customer", "cus_x", db=db, check=False)
    assert missing.returncode == 1 and "no customer cus_x" in missing.stderr


def test_visitor_erase_removes_its_traffic_and_keeps_revenue(history):
    db, site = history["db"], history["site"]
    money = revenue(db, site)
    visitor = rows(db, "SELECT visitor_id FROM events WHERE name = 'pageview' AND referrer_host ="
                       " 'www.google.com'")[0]["visitor_id"]
    own = count(db, "events", "visitor_id = ?", (visitor,))
    assert own == 3

    result = cli_json("visitor", "erase", "--site", site, "--visitor", str(visitor), db=db)
    assert result["events"] == own
    assert result["anonymized_sessions"] == 1 and result["identity_links"] == 1
    assert count(db, "events", "visitor_id = ?", (visitor,)) == 0
    assert count(db, "sessions", "visitor_id = ?", (visitor,)) == 0
    assert count(db, "session_links", "visitor_id = ?", (visitor,)) == 0
    assert count(db, "visitor_identities") == 0
    assert revenue(db, site) == money  # the first touch stays, without the visitor id
    assert cli_json("check", db=db)["ok"]
    bad = run_cli("visitor", "erase", "--site", site, "--visitor", "abc", db=db, check=False)
    assert bad.returncode == 1


@pytest.mark.sqlite_only  # PostgreSQL's archive is restored in test_backup_copies_and_checks
def test_backup_file_is_a_database_sqlite_opens(history, tmp_path):
    copy = tmp_path / "b.db"
    cli_json("backup", str(copy), db=history["db"])
    conn = sqlite3.connect(copy)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def test_visitor_erase_takes_the_browser_id_of_the_script(client, tally, site, clock, db_path):
    browser_id = "0123456789abcdef0123456789abcdef"
    tally.start()
    for path in ("/a", "/b"):
        resp = client.post("/api/v1/collect", orjson.dumps(
            {"s": site["site"]["id"], "e": "pageview", "u": f"https://example.com{path}",
             "v": browser_id}), headers={"User-Agent": UA}, content_type="text/plain",
            extra_environ={"REMOTE_ADDR": GB})
        assert resp.status_int == 204
    assert tally.flusher.flush_now(timeout=WAIT)
    tally.stop(timeout=10)
    assert count(db_path, "events") == 2
    result = cli_json("visitor", "erase", "--site", site["site"]["id"], "--visitor", browser_id,
                      db=db_path)
    assert result["events"] == 2 and result["sessions"] == 1
    assert count(db_path, "events") == 0 and count(db_path, "sessions") == 0
    assert count(db_path, "browser_links") == 0
    assert cli_json("check", db=db_path)["ok"]


def test_postgres_backup_gives_pg_dump_the_password_outside_its_command_line(
        postgres_schema, tmp_path, monkeypatch):
    import subprocess

    from storage.maintenance import backup
    from storage.postgres import PostgresDatabase

    url = postgres_schema.replace("postgres@", "postgres:s3cret-pw@", 1)  # trust auth ignores it
    calls = []
    run = subprocess.run

    def spy(args, **options):
        calls.append((args, options.get("env") or {}))
        return run(args, **options)

    monkeypatch.setattr(subprocess, "run", spy)
    db = PostgresDatabase(url)
    db.check_startup()  # tally init
    try:
        result = backup(db, str(tmp_path / "tally.dump"))
    finally:
        db.close()
    assert result.integrity == "ok" and result.user_version == latest_version(postgres_schema)
    assert [args[0].rsplit("/", 1)[-1] for args, _ in calls] == ["pg_dump", "pg_restore"]
    assert all("s3cret-pw" not in " ".join(args) for args, _ in calls)
    assert calls[0][1]["PGPASSWORD"] == "s3cret-pw"
