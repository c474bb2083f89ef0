"""Schema version 24: a session's first visitor id is sessions.visitor_id alone,
session_visitors keeps its other ids (a visit that crossed midnight UTC, when the daily
salt changes the visitor id) and session_links reads both.

A database of the release before (PostgreSQL version 23, SQLite 21) held every id in
session_visitors, and its first-touch triggers read that table. Data is written through
the service, the database is put back in that release's shape (its links, triggers and
no view or index; schema.sql's text with session_visitors read where this release reads
session_links), and the restarted service moves it over: the reports, first touch and an
erasure give what they gave before.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import webtest

from app import create_app
from storage.sessions import defined_first_touches, stored_first_touches
from tests.conftest import WAIT, bearer, cli_json, config_for, execute, is_postgres, rows

ROOT = Path(__file__).resolve().parent.parent
DAY = 86_400
FIRST_DAY = 1_789_948_800  # 2026-09-21T00:00:00Z
UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
GOOGLE = "https://www.google.com/search"
# Visitor (ip) -> its events: (seconds after FIRST_DAY, name, path, referrer, uid).
VISITS = {
    "192.0.2.1": [(12 * 3600, "pageview", "/", GOOGLE, None),
                  (12 * 3600 + 60, "$identify", "/account", None, "user-a")],
    # Across midnight: yesterday's id opens the visit, today's continues it.
    "192.0.2.2": [(DAY - 600, "pageview", "/pricing", "https://t.co/x", None),
                  (DAY + 600, "Signup", "/app", None, None)],
    "192.0.2.3": [(DAY - 300, "pageview", "/pricing", "https://www.bing.com/", None),
                  (DAY + 300, "pageview", "/docs", None, None)],
    "192.0.2.4": [(DAY + 9 * 3600, "pageview", "/", None, None)],
}


def _send(client, tally, clock, site) -> None:
    headers = {**bearer(site["key"]), "Content-Type": "application/json"}
    events = sorted((FIRST_DAY + at, ip, name, path, referrer, uid)
                    for ip, visit in VISITS.items() for at, name, path, referrer, uid in visit)
    for at, ip, name, path, referrer, uid in events:
        clock.set(at + 1)
        body = {"s": site["site"]["id"], "e": name, "u": f"https://example.com{path}",
                "ts": at * 1000, "ip": ip, "ua": UA}
        if referrer:
            body["r"] = referrer
        if uid:
            body["uid"] = uid
        client.post("/api/v1/events", orjson.dumps(body), headers=headers, status=204)
        assert tally.flusher.flush_now(timeout=WAIT)  # each day's salt before the next


def _today_id(db_path: str, path: str) -> int:
    (row,) = rows(db_path, "SELECT visitor_id FROM events WHERE pathname = ?", (path,))
    return row["visitor_id"]


def _pay(client, site, payment_id: str, customer: dict) -> None:
    client.post("/api/v1/payments", orjson.dumps(
        {"payment_id": payment_id, "amount": 30, "currency": "EUR", "kind": "charge",
         "paid_at": "2026-09-22T12:00:00Z", "customer": customer}),
        headers={**bearer(site["key"]), "Content-Type": "application/json"}, status=200)


def _answers(db_path: str, site_id: str) -> dict:
    dates = ("--from", "2026-09-21", "--to", "2026-09-22")
    revenue = cli_json("report", "revenue", "--site", site_id, *dates, db=db_path)
    funnel = cli_json("report", "funnel", "--site", site_id, "--steps",
                      "page:/pricing,goal:Signup,payment", *dates, db=db_path)
    links = rows(db_path, "SELECT site_id, visitor_id, session_id FROM session_links"
                          " ORDER BY session_id, visitor_id")
    touches = rows(db_path, "SELECT t.customer_id, s.channel FROM customer_first_touch t"
                            " LEFT JOIN sessions s ON s.id = t.session_id ORDER BY 1")
    return {"revenue": revenue, "funnel": funnel, "links": links, "touches": touches}


def _previous_release(db_path: str) -> None:
    """The database as the release before version 24 kept the same data (its first-touch
    triggers read session_visitors)."""
    postgres = is_postgres(db_path)
    execute(db_path, "INSERT INTO session_visitors (site_id, visitor_id, session_id)"
                     " SELECT site_id, visitor_id, id FROM sessions WHERE visitor_id <> 0")
    execute(db_path, "DROP VIEW session_links")
    execute(db_path, "DROP INDEX sessions_site_visitor")
    if postgres:
        script = (ROOT / "storage" / "schema_postgres.sql").read_text()
        for name in ("refresh_run", "earlier_session"):
            body = re.search(rf"CREATE OR REPLACE FUNCTION tally_first_touch_{name}\(\).*?END \$\$;",
                             script, re.S).group(0)
            execute(db_path, body.replace("session_links", "session_visitors"))
        execute(db_path, "UPDATE tally_schema_version SET version = 23")
        return
    script = (ROOT / "schema.sql").read_text()
    for name in ("refresh_run", "earlier_session"):
        trigger = re.search(rf"CREATE TRIGGER IF NOT EXISTS first_touch_{name} .*?\nEND;",  # sql-safe: a fixed trigger name
                            script, re.S).group(0)
        execute(db_path, f"DROP TRIGGER first_touch_{name}")
        execute(db_path, trigger.replace("session_links", "session_visitors"))
    execute(db_path, "PRAGMA user_version = 21")


def test_a_database_of_the_release_before_moves_over_and_answers_the_same(
        client, tally, site, clock, db_path, tmp_path, restore_backup):
    tally.start()
    _send(client, tally, clock, site)
    crossed, erased = _today_id(db_path, "/app"), _today_id(db_path, "/docs")
    clock.set(FIRST_DAY + DAY + 12 * 3600 + 1)
    _pay(client, site, "pay_a", {"id": "cus_a", "user_id": "user-a"})
    _pay(client, site, "pay_b", {"id": "cus_b", "visitor_id": str(crossed)})
    _pay(client, site, "pay_e", {"id": "cus_e", "visitor_id": str(erased)})
    site_id = site["site"]["id"]
    before = _answers(db_path, site_id)
    # Four sessions, two of which crossed midnight: their today's ids are the only links.
    assert len(rows(db_path, "SELECT id FROM sessions")) == 4
    assert sorted(r["visitor_id"] for r in rows(db_path, "SELECT visitor_id FROM session_visitors")
                  ) == sorted([crossed, erased])
    assert [t["channel"] for t in before["touches"]] == ["Organic Search", "Organic Social",
                                                         "Organic Search"]
    tally.stop(timeout=5)

    _previous_release(db_path)
    assert len(rows(db_path, "SELECT 1 FROM session_visitors")) == 6

    restarted = create_app(config_for(db_path), clock=clock)
    try:
        assert restarted.db.schema_version() == restarted.db.latest_version
        assert sorted(r["visitor_id"] for r in rows(
            db_path, "SELECT visitor_id FROM session_visitors")) == sorted([crossed, erased])
        assert _answers(db_path, site_id) == before
        conn = restarted.db.conn()
        assert stored_first_touches(conn) == defined_first_touches(conn)

        # The service goes on: a new visitor gets no link, the crossed visit continues.
        restarted.start()
        app = webtest.TestApp(restarted)
        clock.set(FIRST_DAY + DAY + 1200 + 1)
        headers = {**bearer(site["key"]), "Content-Type": "application/json"}
        for ip, path in (("192.0.2.2", "/later"), ("192.0.2.9", "/new")):
            app.post("/api/v1/events", orjson.dumps(
                {"s": site_id, "e": "pageview", "u": f"https://example.com{path}",
                 "ts": (FIRST_DAY + DAY + 1200) * 1000, "ip": ip, "ua": UA}),
                headers=headers, status=204)
        assert restarted.flusher.flush_now(timeout=WAIT)
        later = rows(db_path, "SELECT session_id FROM events WHERE pathname IN ('/app', '/later')")
        assert len({r["session_id"] for r in later}) == 1
        assert len(rows(db_path, "SELECT 1 FROM sessions")) == 5
        assert len(rows(db_path, "SELECT 1 FROM session_visitors")) == 2
        conn = restarted.db.conn()
        assert stored_first_touches(conn) == defined_first_touches(conn)
    finally:
        restarted.stop(timeout=5)

    # Erasing today's id of the bing visit, cus_e's first touch: the session stays without
    # a visitor id, its yesterday's id still linked, the channel of cus_e's revenue kept.
    revenue = cli_json("report", "revenue", "--site", site_id, "--from", "2026-09-21",
                       "--to", "2026-09-22", db=db_path)
    result = cli_json("visitor", "erase", "--site", site_id, "--visitor", str(erased), db=db_path)
    assert (result["events"], result["sessions"], result["anonymized_sessions"],
            result["customer_links"]) == (1, 0, 1, 1)
    (kept,) = rows(db_path, "SELECT s.id, s.visitor_id FROM customer_first_touch t"
                            " JOIN sessions s ON s.id = t.session_id WHERE t.customer_id = 'cus_e'")
    assert kept["visitor_id"] == 0
    yesterday = rows(db_path, "SELECT visitor_id FROM session_links WHERE session_id = ?",
                     (kept["id"],))
    assert [r["visitor_id"] for r in yesterday] == [
        rows(db_path, "SELECT visitor_id FROM events WHERE pathname = '/pricing'"
                      " AND referrer_host = 'www.bing.com'")[0]["visitor_id"]]
    assert cli_json("report", "revenue", "--site", site_id, "--from", "2026-09-21",
                    "--to", "2026-09-22", db=db_path) == revenue
    assert cli_json("check", db=db_path)["ok"]
    # The moved-over data backs up and restores: the copy checks and answers the same.
    copy = tmp_path / "moved.backup"
    assert cli_json("backup", str(copy), db=db_path)["integrity"] == "ok"
    restored = restore_backup(db_path, copy)
    assert cli_json("check", db=restored)["ok"]
    assert cli_json("report", "revenue", "--site", site_id, "--from", "2026-09-21",
                    "--to", "2026-09-22", db=restored) == revenue
