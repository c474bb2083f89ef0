"""Schema version 25: visitor ids that carry their UTC day (enrichment/visitor.py), decided
by the day's salt row (visitor_salts.dated), on both engines.

A database of the release before (version 24) holds today's salt without the column and
events under its plain 64-bit ids. Upgraded in the middle of that day, the same ip + ua
keeps its id and its session until midnight; the next day's salt is dated, its ids carry
the day, and the visit that crossed midnight continues under both. A second restart on
the data written changes nothing.
"""

from __future__ import annotations

import orjson
import webtest

from app import create_app
from enrichment.visitor import visitor_id
from storage.sessions import defined_first_touches, stored_first_touches
from tests.conftest import (
    WAIT,
    bearer,
    cli_json,
    config_for,
    execute,
    is_postgres,
    latest_version,
    rows,
)
from validation.event import pack_ip

DAY = 86_400
FIRST_DAY = 1_789_948_800  # 2026-09-21T00:00:00Z
TODAY = FIRST_DAY // DAY
UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
OLD_SALT = bytes(range(32))
RETURNING, NEW = "192.0.2.1", "192.0.2.7"


def _send(app, clock, site, at: int, ip: str, path: str) -> None:
    clock.set(at + 1)
    app.post("/api/v1/events", orjson.dumps(
        {"s": site["site"]["id"], "e": "pageview", "u": f"https://example.com{path}",
         "ts": at * 1000, "ip": ip, "ua": UA}),
        headers={**bearer(site["key"]), "Content-Type": "application/json"}, status=204)


def _stored(db_path: str, path: str) -> dict:
    (row,) = rows(db_path, "SELECT visitor_id, session_id FROM events WHERE pathname = ?",
                  (path,))
    return row


def _release_24(db_path: str) -> None:
    """The database as the release before version 25 kept it: no visitor_salts.dated."""
    execute(db_path, "ALTER TABLE visitor_salts DROP COLUMN dated")
    if is_postgres(db_path):
        execute(db_path, "UPDATE tally_schema_version SET version = 24")
    else:
        execute(db_path, "PRAGMA user_version = 24")


def _dated(db_path: str) -> dict[int, int]:
    return {r["day"]: r["dated"] for r in rows(db_path, "SELECT day, dated FROM visitor_salts")}


def test_an_upgrade_mid_day_splits_no_visitor_and_the_next_day_is_dated(
        client, tally, site, clock, db_path):
    number = rows(db_path, "SELECT id FROM sites")[0]["id"]
    # Today's salt as the release before made it on its first event of the day.
    execute(db_path, "INSERT INTO visitor_salts (day, salt, created_at, dated) VALUES (?, ?, 0, 0)",
            (TODAY, OLD_SALT))
    tally.start()
    _send(client, clock, site, FIRST_DAY + 10 * 3600, RETURNING, "/before")
    assert tally.flusher.flush_now(timeout=WAIT)
    before = _stored(db_path, "/before")
    assert before["visitor_id"] == visitor_id(OLD_SALT, number, pack_ip(RETURNING), UA)
    tally.stop(timeout=5)
    _release_24(db_path)

    restarted = create_app(config_for(db_path), clock=clock)
    try:
        assert restarted.db.schema_version() == restarted.db.latest_version == latest_version(db_path)
        assert _dated(db_path) == {TODAY: 0}
        restarted.start()
        app = webtest.TestApp(restarted)
        _send(app, clock, site, FIRST_DAY + 10 * 3600 + 600, RETURNING, "/after")
        assert restarted.flusher.flush_now(timeout=WAIT)
        # The same day, the same ip + ua: one visitor, one session.
        assert _stored(db_path, "/after") == before
        _send(app, clock, site, FIRST_DAY + DAY - 300, RETURNING, "/evening")
        _send(app, clock, site, FIRST_DAY + DAY + 300, RETURNING, "/midnight")
        _send(app, clock, site, FIRST_DAY + DAY + 400, NEW, "/new")
        assert restarted.flusher.flush_now(timeout=WAIT)
    finally:
        restarted.stop(timeout=5)

    assert _dated(db_path) == {TODAY: 0, TODAY + 1: 1}
    tomorrow = rows(db_path, "SELECT salt FROM visitor_salts WHERE day = ?", (TODAY + 1,))[0]["salt"]
    crossed, new = _stored(db_path, "/midnight"), _stored(db_path, "/new")
    for row, ip in ((crossed, RETURNING), (new, NEW)):
        assert row["visitor_id"] == visitor_id(tomorrow, number, pack_ip(ip), UA, TODAY + 1)
        assert row["visitor_id"] >> 48 == 1 + (TODAY + 1) % 32_767
    # The evening's visit (the same visitor as the morning's) crossed midnight and
    # continued under both days' ids.
    evening = _stored(db_path, "/evening")
    assert evening["visitor_id"] == before["visitor_id"]
    assert crossed["session_id"] == evening["session_id"] != new["session_id"]
    links = rows(db_path, "SELECT visitor_id FROM session_links WHERE session_id = ?",
                 (evening["session_id"],))
    assert sorted(r["visitor_id"] for r in links) == sorted([before["visitor_id"],
                                                             crossed["visitor_id"]])
    assert len(rows(db_path, "SELECT 1 FROM sessions")) == 3

    # Restarted on the data written: tomorrow's ids stay what they were.
    again = create_app(config_for(db_path), clock=clock)
    try:
        again.start()
        app = webtest.TestApp(again)
        _send(app, clock, site, FIRST_DAY + DAY + 900, RETURNING, "/later")
        _send(app, clock, site, FIRST_DAY + DAY + 900, NEW, "/new-later")
        assert again.flusher.flush_now(timeout=WAIT)
        assert _stored(db_path, "/later") == crossed
        assert _stored(db_path, "/new-later") == new
        conn = again.db.conn()
        assert stored_first_touches(conn) == defined_first_touches(conn)
    finally:
        again.stop(timeout=5)
    assert cli_json("check", db=db_path)["ok"]
    # Erasing a dated id finds its events as it finds any other.
    result = cli_json("visitor", "erase", "--site", site["site"]["id"], "--visitor",
                      str(new["visitor_id"]), db=db_path)
    assert (result["events"], result["sessions"]) == (2, 1)
