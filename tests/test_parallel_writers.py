"""Issue 29, writers in parallel on PostgreSQL: a flush or a payment locks only its sites
(storage/postgres.py), new sessions take ids from the sessions' sequence
(storage/sessions.py), so one site's writes never wait for another's, and writers of one
site still give exact sessions, first touches, usage and payments.

PostgreSQL only: SQLite has one writer whatever the sites (its behaviour is the suite's).
Hosts are gunicorn masters on their own ports, sharing nothing but the database.
"""

from __future__ import annotations

import threading
import time

import orjson
import pytest
from webtest import TestApp

from app import create_app
from config import Config
from storage.backend import open_database
from storage.directory import Directory
from storage.payments import PaymentStore
from tests.conftest import WAIT, bearer, execute, http, rows, wait_until
from tests.routes import payment
from validation.payment import validate_payment

pytestmark = pytest.mark.slow

HOST_ENV = {"TALLY_FLUSH_INTERVAL": "0.2"}
UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"


def new_site(db: str, name: str, host: str) -> dict:
    """An account of its own, its site and a key (in-process: the CLI is tested elsewhere)."""
    database = open_database(Config(database_url=db))
    try:
        directory = Directory(database, time.time)
        account = directory.create_account(name, "scale")
        site = directory.create_site(account["id"], [host])
        key = directory.create_key(site["id"], ["events", "payments", "read"])
    finally:
        database.close()
    row_id = rows(db, "SELECT id FROM sites WHERE public_id = ?", (site["id"],))[0]["id"]
    return {"account": account["id"], "site": site["id"], "row_id": row_id, "host": host,
            "headers": {**bearer(key["key"]), "Content-Type": "application/json"}}


def post(host, path: str, body: dict, headers: dict):
    return http("POST", host.url + path, orjson.dumps(body), headers)


def site_events(db: str, site: dict) -> int:
    return rows(db, "SELECT count(*) AS n FROM events WHERE site_id = ?",
                (site["row_id"],))[0]["n"]


def test_a_site_is_stored_while_another_sites_transaction_stays_open(
        pooled_postgres_schema, server_factory):
    db = pooled_postgres_schema
    a, b = new_site(db, "A", "a.test"), new_site(db, "B", "b.test")
    host = server_factory(db, workers=1, env=HOST_ENV)
    # Site A's writer: events and a payment written, not committed, the transaction open.
    database = open_database(Config(database_url=db))
    conn = database.connect()
    writes = database.transaction(conn, sites=(a["row_id"],))
    writes.__enter__()
    try:
        conn.execute("INSERT INTO events (site_id, ts, name, pathname, url, hostname)"
                     " VALUES (?, 1790000000000, 'pageview', '/', 'https://a.test/', 'a.test')",
                     (a["row_id"],))
        PaymentStore.write(conn, a["row_id"], validate_payment(payment("pay_a", "cus_a")),
                           1_790_000_000_000)

        # Site B, on another host: its payment is answered, its events stored meanwhile.
        status, _, text = post(host, "/api/v1/payments", payment("pay_b", "cus_b"),
                               b["headers"])
        assert status == 200, text
        batch = {"s": b["site"], "b": [{"e": "pageview", "u": f"https://b.test/{n}",
                                        "ip": f"192.0.2.{n + 1}", "ua": UA} for n in range(5)]}
        assert post(host, "/api/v1/events", batch, b["headers"])[0] == 204
        assert wait_until(lambda: site_events(db, b) == 5)
        assert rows(db, "SELECT payment_id FROM payments") == [{"payment_id": "pay_b"}]
        assert rows(db, "SELECT count(*) AS n FROM sessions")[0]["n"] == 5
        assert conn.in_transaction  # A's writes were open all along
    finally:
        writes.__exit__(None, None, None)
        conn.close()
    assert site_events(db, a) == 1
    assert [r["payment_id"] for r in rows(db, "SELECT payment_id FROM payments ORDER BY 1")] == [
        "pay_a", "pay_b"]
    assert host.stop() == 0


def test_two_hosts_hammering_one_site_store_exact_sessions_touches_usage_and_payments(
        pooled_postgres_schema, server_factory):
    db = pooled_postgres_schema
    site = new_site(db, "Busy", "busy.test")
    hosts = [server_factory(db, workers=2, env=HOST_ENV) for _ in range(2)]
    visitors, rounds = 12, 6
    failures: list[str] = []

    def hammer(number: int) -> None:
        host = hosts[number % 2]
        for round_ in range(rounds):
            batch = {"s": site["site"], "b": [
                {"e": "pageview", "u": f"https://busy.test/h{number}/r{round_}",
                 "ip": f"198.51.100.{visitor + 1}", "ua": UA,
                 **({"r": "https://www.google.com/"} if round_ == 0 else {})}
                for visitor in range(visitors)]}
            status, _, text = post(host, "/api/v1/events", batch, site["headers"])
            if status != 204:
                failures.append(f"events: {status} {text!r}")
            identify = {"s": site["site"], "e": "$identify", "u": "https://busy.test/account",
                        "uid": f"user-{number}", "ip": f"198.51.100.{number + 1}", "ua": UA}
            status, _, text = post(host, "/api/v1/events", identify, site["headers"])
            if status != 204:
                failures.append(f"identify: {status} {text!r}")
            # The same payment through both hosts at once is one payment.
            body = payment(f"pay_{number // 2}_{round_}", f"cus_{number}",
                           customer={"id": f"cus_{number}", "user_id": f"user-{number}"})
            status, _, text = post(host, "/api/v1/payments", body, site["headers"])
            if status != 200:
                failures.append(f"payment: {status} {text!r}")

    threads = [threading.Thread(target=hammer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert not failures, failures[:3]
    pageviews = 4 * rounds * visitors
    identifies = 4 * rounds
    assert wait_until(lambda: site_events(db, site) == pageviews + identifies)
    for host in hosts:
        assert host.stop() == 0

    # One session per visitor (all within minutes), holding every one of its pageviews.
    sessions = rows(db, "SELECT id, visitor_id, pageviews, custom_events FROM sessions")
    assert len(sessions) == visitors
    assert len({s["visitor_id"] for s in sessions}) == visitors
    assert sum(s["pageviews"] for s in sessions) == pageviews
    assert rows(db, "SELECT count(*) AS n FROM session_links")[0]["n"] == visitors
    events_without_session = rows(
        db, "SELECT count(*) AS n FROM events WHERE session_id IS NULL AND name = 'pageview'")
    assert events_without_session[0]["n"] == 0
    # Every customer's first touch is their visitor's session, from Google.
    touches = rows(db, "SELECT t.customer_id, s.channel FROM customer_first_touch t"
                       " JOIN sessions s ON s.id = t.session_id ORDER BY 1")
    assert touches == [{"customer_id": f"cus_{n}", "channel": "Organic Search"}
                       for n in range(4)]
    # Usage counts every counted event once (a keyed $identify is not counted); payments
    # sent twice are stored once.
    usage = rows(db, "SELECT sum(events) AS n FROM monthly_usage")[0]["n"]
    assert usage == pageviews
    assert rows(db, "SELECT count(*) AS n FROM payments")[0]["n"] == 2 * rounds
    assert rows(db, "SELECT count(*) AS n FROM customers")[0]["n"] == 4


def test_an_upgraded_database_gives_new_sessions_ids_past_the_stored_ones(
        pooled_postgres_schema, clock):
    """Before version 21 the flush wrote sessions' ids past the largest without moving the
    sequence; the upgrade moves it, so new sessions never take a stored id, and replaces
    the first-touch row trigger on new links by a statement-level one."""
    db = pooled_postgres_schema
    site = new_site(db, "Old", "old.test")
    for session_id in (1, 2, 40):
        execute(db, "INSERT INTO sessions (id, site_id, visitor_id, started_at, last_seen_at,"
                    " channel, pageviews, custom_events) VALUES (?, ?, ?, 0, 0, 'Direct', 1, 0)",
                (session_id, site["row_id"], session_id))
    execute(db, "SELECT setval(pg_get_serial_sequence('sessions', 'id'), 1, false)")
    # Version 16's first-touch trigger on new links ran once per row.
    execute(db, "DROP TRIGGER first_touch_new_session_visitor ON session_visitors")
    execute(db, "CREATE FUNCTION tally_first_touch_new_session_visitor() RETURNS trigger"
                " LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'")
    execute(db, "CREATE TRIGGER first_touch_new_session_visitor AFTER INSERT ON"
                " session_visitors FOR EACH ROW"
                " EXECUTE FUNCTION tally_first_touch_new_session_visitor()")
    execute(db, "UPDATE tally_schema_version SET version = 16")

    tally = create_app(Config(database_url=db), clock=clock)
    assert tally.db.schema_version() == tally.db.latest_version
    rows_ = [{"s": site["site"], "e": "pageview", "u": f"https://old.test/{n}",
              "ip": f"203.0.113.{n + 1}", "ua": UA} for n in range(3)]
    TestApp(tally).post("/api/v1/events", orjson.dumps({"s": site["site"], "b": rows_}),
                        headers=site["headers"], status=204)
    assert tally.flusher.flush_now(timeout=WAIT)
    tally.stop(timeout=5)
    ids = [r["id"] for r in rows(db, "SELECT id FROM sessions ORDER BY id")]
    assert ids == [1, 2, 40, 41, 42, 43]
    # The trigger runs once per statement now (tgtype odd: once per row).
    assert rows(db, "SELECT tgtype % 2 AS per_row FROM pg_trigger"
                    " WHERE tgname = 'first_touch_new_session_visitor'"
                    " AND tgrelid = 'session_visitors'::regclass") == [{"per_row": 0}]
