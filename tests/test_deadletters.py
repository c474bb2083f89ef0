"""A flush never retries what retrying cannot fix: a failing batch is split, everything
storable is stored, and each event that still fails is set aside in dead_letters."""

from __future__ import annotations

import orjson
import pytest

import metrics
from quota.usage import QuotaGuard
from storage.db import Database
from storage.maintenance import delete_site
from tests.conftest import (
    WAIT,
    FakeClock,
    bearer,
    beside_tally,
    cli_json,
    execute,
    is_postgres,
    rows,
    run_cli,
    wait_until,
)
from tests.test_ingest import NOW_MS, count, make_flusher, unit
from validation.event import parse_events

FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"


def refusing_trigger(db_path: str, name: str, table: str, message: str,
                     when: str | None = None) -> None:
    """A real fault of the database: a trigger that refuses the rows `when` holds for (all
    without it) as a constraint would (SQLite's RAISE(ABORT), PostgreSQL's check_violation)."""
    if is_postgres(db_path):
        execute(db_path, f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$"
                         f" BEGIN RAISE EXCEPTION '{message}' USING ERRCODE = 'check_violation';"
                         " END $$")
        condition = f"WHEN ({when})" if when else ""
        # sql-safe: the test's own fixed trigger, table and condition text
        beside_tally(db_path, f"CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW"
                              f" {condition} EXECUTE FUNCTION {name}()")
    else:
        condition = f"WHEN {when}" if when else ""
        # sql-safe: the test's own fixed trigger, table and condition text
        execute(db_path, f"CREATE TRIGGER {name} BEFORE INSERT ON {table} {condition}"
                         f" BEGIN SELECT RAISE(ABORT, '{message}'); END")


def drop_trigger(db_path: str, name: str, table: str) -> None:
    beside_tally(db_path, f"DROP TRIGGER {name} ON {table}" if is_postgres(db_path)
                 else f"DROP TRIGGER {name}")


def poison_trigger(db_path: str) -> None:
    """A real fault of the database that only an event titled "poison" triggers."""
    refusing_trigger(db_path, "poison", "events", "poisoned row", "NEW.title = 'poison'")


def constraint_error(db_path: str) -> str:
    """The name of the exception a refused row raises, as the reason records it."""
    return "CheckViolation" if is_postgres(db_path) else "IntegrityError"


def titled(titles: list[str]):
    events = [parse_events({"s": "site", "e": "pageview", "u": f"https://example.com/{i}",
                            "t": title, "ip": "81.2.69.142", "ua": FIREFOX}, NOW_MS)[1][0]
              for i, title in enumerate(titles)]
    base = unit(1)
    return base._replace(events=events, counted=len(events))


def dead_lettered() -> float:
    """tally_events_total{outcome="dead_lettered"} of this process (what /metrics adds up)."""
    metrics.enable()  # as an app with /metrics on does
    return metrics.LOCAL.get_sample_value("tally_events_total", {"outcome": "dead_lettered"}) or 0


def test_one_poison_event_is_set_aside_and_every_other_event_is_stored(store, db_path, caplog):
    poison_trigger(db_path)
    lettered_before = dead_lettered()
    guard = QuotaGuard(store, FakeClock(NOW_MS / 1000))
    flusher = make_flusher(store, quota=guard)
    mixed = titled(["a", "b", "poison", "c", "d"])
    for part in (unit(10), mixed, unit(7)):
        guard.hold((1, "2026-09"), part.counted)
        assert flusher.submit(part)
    assert flusher.flush_now(timeout=WAIT)
    assert count(db_path) == 21  # 10 + the four good events of the mixed unit + 7
    assert count(db_path, "SELECT events FROM monthly_usage") == 21
    assert guard.used((1, "2026-09")) == 21  # the set-aside event no longer held
    assert flusher.set_aside_events == 1 and flusher.queue.held == 0
    assert dead_lettered() == lettered_before + 1
    (letter,) = rows(db_path, "SELECT * FROM dead_letters")
    assert letter["site_id"] == 1 and letter["month"] == "2026-09"
    assert "poisoned row" in letter["reason"] and constraint_error(db_path) in letter["reason"]
    event = orjson.loads(letter["event"])
    assert event["title"] == "poison" and event["ip"] == "(not kept)"
    assert "81.2.69.142" not in letter["event"]
    assert "stored 21 events, set aside 1" in caplog.text

    # Later events are stored as before: nothing stays stuck.
    assert flusher.submit(unit(3)) and flusher.flush_now(timeout=WAIT)
    assert count(db_path) == 24
    flusher.stop(timeout=5)

    check = run_cli("check", "--json", db=db_path)
    assert check.returncode == 0 and orjson.loads(check.stdout)["dead_letters"] == 1
    assert "dead letters: 1 accepted events" in run_cli("check", db=db_path).stdout
    listed = cli_json("deadletter", "list", db=db_path)
    assert listed["total"] == 1
    assert listed["dead_letters"][0]["event"]["url"] == "https://example.com/2"


def test_events_of_a_site_removed_while_they_wait_are_set_aside(store, db_path):
    """A site removed with events of it still queued: those are set aside and every other
    site's are stored. On PostgreSQL events, sessions and their links carry no foreign key
    to sites (the flush checks its sites once, under their locks), so this is the flush's
    own check at work there; SQLite's foreign keys refuse the rows."""
    with store.transaction() as conn:
        conn.execute("INSERT INTO sites (id, public_id, account_id, created_at)"
                     " VALUES (2, 'site_b', 1, 0)")
    flusher = make_flusher(store)
    assert flusher.submit(unit(3)) and flusher.flush_now(timeout=WAIT)
    delete_site(store, 1)
    assert flusher.submit(unit(2, site_id=1)) and flusher.submit(unit(4, site_id=2))
    assert flusher.flush_now(timeout=WAIT)
    flusher.stop(timeout=5)
    assert rows(db_path, "SELECT site_id, count(*) AS n FROM events GROUP BY site_id") == [
        {"site_id": 2, "n": 4}]
    assert count(db_path, "SELECT count(*) FROM sessions WHERE site_id = 1") == 0
    assert count(db_path, "SELECT count(*) FROM session_visitors WHERE site_id = 1") == 0
    letters = rows(db_path, "SELECT site_id, reason FROM dead_letters")
    assert [letter["site_id"] for letter in letters] == [1, 1]
    if is_postgres(db_path):
        assert all("SiteNotStored: site 1 is not stored" in letter["reason"]
                   for letter in letters)
    assert flusher.set_aside_events == 2
    report = cli_json("check", db=db_path)
    assert report["foreign_key_violations"] == 0 and report["dead_letters"] == 2

    # Restarted on the data: the next flush stores the remaining site's events.
    again = make_flusher(store)
    assert again.submit(unit(5, site_id=2)) and again.flush_now(timeout=WAIT)
    again.stop(timeout=5)
    assert count(db_path, "SELECT count(*) FROM events WHERE site_id = 2") == 9


def test_a_bug_in_enrichment_for_one_event_sets_only_that_event_aside(store, db_path,
                                                                       monkeypatch):
    flusher = make_flusher(store)
    original = flusher.enricher.build

    def build(conn, units):
        if any(e.title == "crash" for u in units for e in u.events):
            raise KeyError("parser bug")
        return original(conn, units)

    monkeypatch.setattr(flusher.enricher, "build", build)
    assert flusher.submit(titled(["x", "crash", "y", "z"])) and flusher.submit(unit(4))
    assert flusher.flush_now(timeout=WAIT)
    assert count(db_path) == 7
    (letter,) = rows(db_path, "SELECT reason, event FROM dead_letters")
    assert letter["reason"] == "KeyError: 'parser bug'"
    flusher.stop(timeout=5)


def test_a_database_that_fails_for_every_write_keeps_every_event(store, db_path):
    """When even the dead-letter write fails, the database is at fault: nothing is set aside,
    and everything is stored once it recovers."""
    poison_trigger(db_path)
    refusing_trigger(db_path, "refuse_letters", "dead_letters", "no room")
    flusher = make_flusher(store)
    assert flusher.submit(titled(["a", "poison", "b"]))
    assert not flusher.flush_now(timeout=0.5)
    # The good events are stored; the poison one stays held, its dead letter refused.
    assert wait_until(lambda: count(db_path) == 2 and flusher.queue.held == 1)
    assert count(db_path, "SELECT count(*) FROM dead_letters") == 0
    drop_trigger(db_path, "refuse_letters", "dead_letters")
    assert flusher.flush_now(timeout=WAIT)
    assert count(db_path) == 2 and count(db_path, "SELECT count(*) FROM dead_letters") == 1
    flusher.stop(timeout=5)


def test_identify_with_a_nul_uid_is_stored_and_does_not_stop_storage(client, tally, site,
                                                                     db_path):
    """Item 1 of the issue: SQLite's length() stops at NUL, so the old CHECK refused what
    the validator accepted and the flush retried the batch forever. PostgreSQL stores NUL
    (and the private-use character that escapes it) escaped: still 128 bytes as sent fit."""
    headers = {**bearer(site["key"]), "Content-Type": "application/json"}
    site_id = site["site"]["id"]
    uids = ["\u0000", "\u0000" * 128, "\ue000" * 42 + "\u0000x"]
    for uid in uids:
        poison = {"s": site_id, "e": "$identify", "uid": uid, "u": "https://example.com/",
                  "ip": "203.0.113.7", "ua": "Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0"}
        client.post("/api/v1/events", orjson.dumps(poison), headers=headers, status=204)
    for i in range(5):
        body = {"s": site_id, "e": "pageview", "u": f"https://example.com/{i}", "ua": FIREFOX}
        client.post("/api/v1/events", orjson.dumps(body), headers=headers, status=204)
    assert tally.flusher.flush_now(timeout=WAIT)
    assert count(db_path) == 8
    assert sorted(r["uid"] for r in rows(db_path, "SELECT uid FROM visitor_identities")) == sorted(uids)
    assert sorted(r["uid"] for r in rows(db_path, "SELECT uid FROM events WHERE uid IS NOT NULL")
                  ) == sorted(uids)
    assert count(db_path, "SELECT count(*) FROM dead_letters") == 0


@pytest.mark.sqlite_only  # the upgrade of a SQLite file
def test_schema_8_databases_get_the_uid_check_in_bytes(db_path):
    db = Database(db_path)
    conn = db.conn()
    conn.execute("PRAGMA legacy_alter_table = ON")
    conn.execute("CREATE TABLE old (site_id INTEGER NOT NULL REFERENCES sites (id),"
                 " uid TEXT NOT NULL CHECK (length(uid) BETWEEN 1 AND 128),"
                 " visitor_id INTEGER NOT NULL, linked_at INTEGER NOT NULL,"
                 " PRIMARY KEY (site_id, uid, visitor_id)) WITHOUT ROWID")
    conn.execute("DROP TABLE visitor_identities")
    conn.execute("ALTER TABLE old RENAME TO visitor_identities")
    conn.execute("INSERT INTO accounts (id, public_id, name, created_at) VALUES (1, 'a', 'A', 0)")
    conn.execute("INSERT INTO sites (id, public_id, account_id, created_at) VALUES (1, 's', 1, 0)")
    conn.execute("INSERT INTO visitor_identities VALUES (1, 'kept', 7, 0)")
    conn.execute("PRAGMA user_version = 8")
    db.close()

    upgraded = Database(db_path).conn()
    upgraded.execute("INSERT INTO visitor_identities VALUES (1, ?, 8, 0)", ("\x00x",))
    assert upgraded.execute("SELECT uid FROM visitor_identities ORDER BY visitor_id"
                            ).fetchall() == [("kept",), ("\x00x",)]
    names = {r[0] for r in upgraded.execute("SELECT name FROM sqlite_master")}
    assert {"visitor_identities_visitor", "first_touch_new_identity"} <= names
    assert upgraded.execute("PRAGMA user_version").fetchone()[0] >= 9
    upgraded.close()
