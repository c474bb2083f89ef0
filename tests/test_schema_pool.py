"""The test suite's reused PostgreSQL schemas (tests/schema_pool.py) are as new ones: a
schema a test filled, given back and handed out again dumps exactly as a schema Tally
has just made (tables, rows, sequences, triggers, functions); one whose catalog or
version a test changed is dropped, not reused; a connection left on its old name no
longer reaches it."""

from __future__ import annotations

import subprocess

import orjson
import psycopg
import pytest
import webtest

from app import create_app
from tests.conftest import (
    WAIT,
    FakeClock,
    bearer,
    config_for,
    connect,
    execute,
    fill_postgres_disk,
    free_postgres_disk,
    latest_version,
    new_postgres_schema,
    rows,
)
from tests.realparts import POSTGRES_URL, postgres_admin
from tests.schema_pool import SchemaPool


@pytest.fixture
def pool():
    pool = SchemaPool(POSTGRES_URL, postgres_admin)
    yield pool
    pool.close()


def name_of(url: str) -> str:
    return url.rpartition("search_path%3D")[2]


def dump(url: str) -> str:
    """pg_dump of the schema, data included, with its name taken out."""
    name = name_of(url)
    text = subprocess.run(["pg_dump", f"--schema={name}", f"--dbname={POSTGRES_URL}"],
                          check=True, capture_output=True, text=True, timeout=WAIT).stdout
    # pg_dump's \restrict lines carry a random key of each run.
    lines = [line for line in text.splitlines() if not line.startswith(("\\restrict", "\\unrestrict"))]
    return "\n".join(lines).replace(name, "SCHEMA")


def use_everything(url: str) -> None:
    """What tests do: accounts, sites, keys, events through the flush (sessions, visitors,
    identities, first touch) into the monthly partitions start-up makes, payments, a
    report's stored days; sequences advanced."""
    clock = FakeClock()
    tally = create_app(config_for(url), clock=clock)
    try:
        tally.start()
        account = tally.directory.create_account("Used", "scale")
        site = tally.directory.create_site(account["id"], ["example.com"])
        key = tally.directory.create_key(site["id"], ["events", "payments", "read"])["key"]
        client = webtest.TestApp(tally)
        events = [{"e": "pageview", "u": f"https://example.com/{n}", "ip": "81.2.69.160",
                   "ua": "Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0",
                   "r": "https://www.google.com/"} for n in range(5)]
        events.append({"e": "$identify", "u": "https://example.com/", "ip": "81.2.69.160",
                       "ua": "Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0", "uid": "u-1"})
        client.post("/api/v1/events", orjson.dumps({"s": site["id"], "b": events}),
                    headers=bearer(key), content_type="application/json", status=204)
        assert tally.flusher.flush_now(timeout=WAIT)
        payment = {"payment_id": "pay_1", "amount": 10, "currency": "EUR", "kind": "charge",
                   "paid_at": "2026-09-21T10:00:00Z",
                   "customer": {"id": "cus_1", "user_id": "u-1"}}
        client.post("/api/v1/payments", orjson.dumps(payment), headers=bearer(key),
                    content_type="application/json", status=200)
        clock.advance(3 * 86_400)
        client.get("/api/v1/stats/aggregate?from=2026-09-15&to=2026-09-23", headers=bearer(key),
                   status=200)
    finally:
        tally.stop(timeout=WAIT)
    assert rows(url, "SELECT count(*) AS n FROM events")[0]["n"] == 6
    assert rows(url, "SELECT count(*) AS n FROM events_2026_09")[0]["n"] == 6
    assert rows(url, "SELECT count(*) AS n FROM customer_first_touch")[0]["n"] == 1


def test_a_schema_given_back_is_handed_out_again_as_a_new_one(pool):
    url = pool.take()
    use_everything(url)
    pool.give_back(url)
    [kept] = pool._idle
    again = pool.take()
    assert name_of(again) == kept != name_of(url)  # the same schema, renamed
    with new_postgres_schema() as new:
        create_app(config_for(new)).db.check_startup()  # Tally makes its tables
        fresh = dump(new)
    assert "pg_catalog.setval" in fresh  # the dump shows every sequence's state
    assert dump(again) == fresh
    assert rows(again, "SELECT version FROM tally_schema_version") == [
        {"version": latest_version(again)}]
    use_everything(again)  # and it works as a new one does
    pool.give_back(again)


def test_a_connection_left_on_the_old_name_no_longer_reaches_it(pool):
    url = pool.take()
    left_open = connect(url)
    try:
        left_open.execute("INSERT INTO accounts (public_id, name, created_at) VALUES ('acct_x', 'x', 0)")
        pool.give_back(url)
        again = pool.take()
        with pytest.raises(psycopg.errors.UndefinedTable):
            left_open.execute("INSERT INTO accounts (public_id, name, created_at)"
                              " VALUES ('acct_y', 'y', 0)")
        assert rows(again, "SELECT count(*) AS n FROM accounts") == [{"n": 0}]
    finally:
        left_open.close()
    pool.give_back(again)


@pytest.mark.parametrize("change", ["trigger", "trigger off", "index", "column", "version",
                                    "analyze"])
def test_a_schema_a_test_changed_is_dropped_not_reused(pool, change):
    url = pool.take()
    if change == "trigger":  # a function and a trigger, the trigger dropped again
        fill_postgres_disk(url, ("events",))
        free_postgres_disk(url, ("events",))
    elif change == "trigger off":
        execute(url, "ALTER TABLE customers DISABLE TRIGGER first_touch_new_customer")
    elif change == "index":
        execute(url, "CREATE INDEX events_by_name ON events (name)")
    elif change == "column":
        execute(url, "ALTER TABLE events ADD COLUMN extra TEXT")
    elif change == "version":
        execute(url, "UPDATE tally_schema_version SET version = 1")
    else:
        execute(url, "INSERT INTO accounts (public_id, name, created_at) VALUES ('acct_a', 'a', 0)")
        execute(url, "ANALYZE accounts")
    pool.give_back(url)
    assert pool._idle == []
    admin = postgres_admin()
    try:
        assert admin.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s",
                             (name_of(url),)).fetchone()[0] == 0
    finally:
        admin.close()
