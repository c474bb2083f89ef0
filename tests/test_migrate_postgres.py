"""`tally migrate-to-postgres`: a SQLite database with users, events, sessions, identities,
payments and subscriptions moves into PostgreSQL whole, and Tally goes on from there."""

from __future__ import annotations

import sqlite3

import orjson
import pytest
import webtest

from app import create_app
from tests import dashboard_seed as seed
from tests.conftest import WAIT, FakeClock, bearer, cli_json, config_for, rows, run_cli
from tests.lifecycle import server_now, tables_not_analyzed_since

REPORTS = (("revenue",), ("mrr",), ("traffic", "--by", "source"), ("goals",),
           ("timeseries", "--interval", "day"))


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A SQLite database as a site owner's would be after some weeks: the dashboard's world."""
    db = str(tmp_path_factory.mktemp("migrate") / "tally.db")
    return (db, *seed.world(db))


def tables(db: str) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            " ORDER BY name")]


def content(db: str, table: str) -> list[tuple]:
    """Every row, as comparable tuples in a fixed order."""
    found = rows(db, f"SELECT * FROM {table}")  # noqa: S608 - names from sqlite_master
    return sorted((tuple(sorted(row.items())) for row in found), key=repr)


def report(db: str, site: str, *args: str, now: str = "2026-09-21") -> dict:
    extra = () if args[0] == "mrr" else ("--to", now)
    return cli_json("report", *args, "--site", site, *extra, db=db)


def test_every_row_moves_and_reports_give_the_same_figures(seeded, postgres_schema):
    source, world, _ = seeded
    moved = cli_json("migrate-to-postgres", "--to", postgres_schema, db=source)
    assert moved["skipped"] == []
    assert moved["tables"]["events"] > 0 and moved["tables"]["payments"] == 3
    assert moved["tables"]["subscriptions"] == 3 and moved["tables"]["sessions"] > 0
    assert moved["tables"]["visitor_identities"] > 0 and moved["tables"]["users"] == 2
    for table in tables(source):
        assert content(postgres_schema, table) == content(source, table), table
    assert moved["rows"] == sum(len(content(source, t)) for t in tables(source))
    site = world["a"]["site"]
    for args in REPORTS:
        assert report(postgres_schema, site, *args) == report(source, site, *args), args
    assert cli_json("check", db=postgres_schema)["ok"] is True


def test_the_copy_is_analyzed_so_its_first_reports_are_planned_for_what_it_holds(
        seeded, postgres_schema):
    source, _, _ = seeded
    started = server_now(postgres_schema)
    cli_json("migrate-to-postgres", "--to", postgres_schema, db=source)
    assert tables_not_analyzed_since(postgres_schema, started) == []
    assert rows(postgres_schema, "SELECT count(*) AS n FROM pg_stats"
                " WHERE schemaname = current_schema() AND tablename = 'events'")[0]["n"] > 0


def test_tally_goes_on_from_the_copy(seeded, postgres_schema):
    source, world, now = seeded
    cli_json("migrate-to-postgres", "--to", postgres_schema, db=source)
    # The events are in their months' partitions, none left waiting in the default one.
    assert rows(postgres_schema, "SELECT count(*) AS n FROM events_default") == [{"n": 0}]
    assert rows(postgres_schema, "SELECT count(*) AS n FROM events_2026_09")[0]["n"] > 0
    largest = rows(postgres_schema, "SELECT max(id) AS id FROM events")[0]["id"]
    # New rows take ids after the copied ones; the first-touch triggers work again.
    account = cli_json("account", "create", "--name", "After", "--plan", "free", db=postgres_schema)
    site = cli_json("site", "create", "--account", account["id"], "--host", "after.test",
                    db=postgres_schema)
    assert site["id"] not in (world["a"]["site"], world["b"]["site"])
    clock = FakeClock(now)
    tally = create_app(config_for(postgres_schema), clock=clock)
    try:
        client = webtest.TestApp(tally)
        headers = {**bearer(world["a"]["key"]), "Content-Type": "application/json"}
        ip, ua = "203.0.113.50", seed.UA
        client.post("/api/v1/events", orjson.dumps({
            "s": world["a"]["site"], "e": "pageview", "u": "https://shop.test/?utm_source=later",
            "ip": ip, "ua": ua}), headers=headers, status=204)
        client.post("/api/v1/events", orjson.dumps({
            "s": world["a"]["site"], "e": "$identify", "u": "https://shop.test/",
            "uid": "u-later", "ip": ip, "ua": ua}), headers=headers, status=204)
        assert tally.flusher.flush_now(timeout=WAIT)
        client.post("/api/v1/payments", orjson.dumps({
            "payment_id": "pay_later", "amount": 5, "currency": "EUR", "kind": "charge",
            "paid_at": "2026-09-21T14:13:20Z", "customer": {"id": "cus_later", "user_id": "u-later"}}),
            headers=headers, status=200)
        customer = client.get("/api/v1/customers/cus_later", headers=bearer(world["a"]["key"])).json
    finally:
        tally.stop(timeout=5)
    assert customer["data"]["attribution"]["source"] == "later"
    assert rows(postgres_schema, "SELECT count(*) AS n FROM events WHERE id > ?",
                (largest,)) == [{"n": 2}]


def test_a_target_that_holds_rows_is_refused_and_left_alone(seeded, postgres_schema):
    source, _, _ = seeded
    cli_json("account", "create", "--name", "Already here", "--plan", "free", db=postgres_schema)
    refused = run_cli("migrate-to-postgres", "--to", postgres_schema, db=source, check=False)
    assert refused.returncode == 1
    assert "not empty" in refused.stderr and "accounts" in refused.stderr
    assert [r["name"] for r in rows(postgres_schema, "SELECT name FROM accounts")] == ["Already here"]


def test_a_postgresql_url_is_required(seeded):
    source, _, _ = seeded
    refused = run_cli("migrate-to-postgres", "--to", "/tmp/x.db", db=source, check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "tally: migrate-to-postgres needs --to postgresql://... (or TALLY_DATABASE_URL)")
