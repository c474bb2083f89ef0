"""The previous days' visitor salts a flush reads in one statement (issue 29), on both
engines: what storage.salts.read_salts gives, and the visitor ids and sessions a flush
spanning several receipt days gets from them, on a database reopened between flushes."""

from __future__ import annotations

import pytest

from enrichment.enricher import Enricher, previous_visitor_ids
from enrichment.visitor import hashed_visitor_id, salt_hasher
from ingest import pipeline
from ingest.queue import Accepted
from storage.backend import open_database
from storage.salts import Salt, insert_salt, read_salt, read_salts
from tests.conftest import FakeClock, config_for, counting_bytes, rows
from validation.event import parse_events
from vocabulary import DAY_MS, IDENTIFY

FIRST_DAY = 20_700  # 2026-09-04
MIN = 60_000
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
IP, IP_PACKED = "81.2.69.142", bytes([81, 2, 69, 142])


def salt_of(n: int) -> bytes:
    return bytes([n]) * 32


def visitor_id(conn, day: int, ua: str) -> int:
    """The id of the test's ip + `ua` on site 1 under the stored salt of `day`."""
    return hashed_visitor_id(salt_hasher(read_salt(conn, day), day, 1), IP_PACKED, ua)


def open_db(db_path: str):
    return open_database(config_for(db_path))


@pytest.fixture
def db(one_site_db):
    return one_site_db


class Counting:
    """A connection that counts the statements run through it."""

    def __init__(self, conn):
        self._conn = conn
        self.statements = 0

    def execute(self, sql, params=()):
        self.statements += 1
        return self._conn.execute(sql, params)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def store_salts(db, days: dict[int, bytes]) -> None:
    conn = db.conn()
    with db.transaction(conn, sites=()):
        for day, salt in days.items():
            insert_salt(conn, day, salt, 0)


@pytest.mark.parametrize("days, expected", [
    ([], {}),
    ([FIRST_DAY, FIRST_DAY + 1], {FIRST_DAY: Salt(salt_of(1), True),
                                  FIRST_DAY + 1: Salt(salt_of(2), True)}),
    ([FIRST_DAY + 5, FIRST_DAY - 1], {}),
    ([FIRST_DAY - 1, FIRST_DAY + 1, FIRST_DAY + 5], {FIRST_DAY + 1: Salt(salt_of(2), True)}),
    ([FIRST_DAY, FIRST_DAY, FIRST_DAY + 1, FIRST_DAY], {FIRST_DAY: Salt(salt_of(1), True),
                                                         FIRST_DAY + 1: Salt(salt_of(2), True)}),
], ids=["none", "present", "absent", "mixed", "duplicates"])
def test_salts_of_several_days_are_read_in_one_statement(db, days, expected):
    store_salts(db, {FIRST_DAY: salt_of(1), FIRST_DAY + 1: salt_of(2), FIRST_DAY + 2: salt_of(3)})
    conn = Counting(db.conn())
    assert read_salts(conn, days) == expected
    assert conn.statements == (1 if days else 0)
    for day in set(days):  # what a read a day gives
        assert read_salts(db.conn(), [day]).get(day) == read_salt(db.conn(), day)


def received(day: int, minute: int, *elements: dict) -> Accepted:
    """A unit received `minute` minutes after the start of UTC day `day`, its events at
    that time."""
    now = day * DAY_MS + minute * MIN
    events = parse_events({"s": "s", "b": list(elements)}, now)[1]
    counted = sum(1 for event in events if event.name != IDENTIFY)
    return Accepted(1, 1, "2026-09", day, events, counted)


def visit(ua: str, path: str = "/") -> dict:
    return {"e": "pageview", "u": "https://example.com" + path, "ip": IP, "ua": ua}


def flush(db, units: list[Accepted], clock_day: int, random_bytes) -> None:
    """The pipeline's steps as the flush thread runs them, on a new Enricher (a worker
    just started)."""
    enricher = Enricher(db, FakeClock(clock_day * DAY_MS / 1000), random_bytes)
    conn = db.conn()
    batch = pipeline.enrich(enricher, conn, units)
    with db.transaction(conn):
        pipeline.write_batch(conn, batch)


def test_a_flush_spanning_several_days_continues_each_days_visits(db_path, db):
    # Visitors who came late on three different days and came back just after each
    # midnight; a fourth came back after a day whose salt no flush ever made.
    days = [FIRST_DAY, FIRST_DAY + 2, FIRST_DAY + 4]
    agents = {day: f"{FIREFOX} v{n}" for n, day in enumerate(days)}
    no_salt_day = FIRST_DAY + 7
    random_bytes = counting_bytes()  # every salt made differs from the others
    flush(db, [received(day - 1, 23 * 60 + 50, visit(agents[day], "/late")) for day in days],
          days[-1], random_bytes)
    evening = {day: rows(db_path, "SELECT session_id FROM events WHERE pathname = '/late'"
                                  " AND visitor_id = ?",
                         (visitor_id(db.conn(), day - 1, agents[day]),)
                         )[0]["session_id"] for day in days}
    db.close()

    # A restarted worker flushes the returns of every day in one batch.
    db = open_db(db_path)
    enricher = Enricher(db, FakeClock(no_salt_day * DAY_MS / 1000), random_bytes)
    conn = db.conn()
    units = [received(day, 5, visit(agents[day], "/back"), visit(agents[day], "/again"))
             for day in days]
    units.append(received(no_salt_day, 5, visit(FIREFOX, "/back")))
    batch = pipeline.enrich(enricher, conn, units)
    counting = Counting(conn)
    previous = previous_visitor_ids(counting, batch)
    assert counting.statements == 1  # four days reached back to, one read
    # The ids each day's salt gives, read a day at a time; none for the day without one.
    expected = [visitor_id(conn, day - 1, agents[day])
                for day in days for _ in range(2)]
    assert previous == [*expected, None]
    assert read_salt(conn, no_salt_day - 1) is None
    with db.transaction(conn):
        pipeline.write_batch(conn, batch)
    db.close()

    # Reopened: each return continued the visit of the evening before, under both ids.
    db = open_db(db_path)
    try:
        for n, day in enumerate(days):
            stored = rows(db_path, "SELECT session_id, visitor_id FROM events WHERE pathname IN"
                                   " ('/back', '/again') AND visitor_id = ? ORDER BY id",
                          (visitor_id(db.conn(), day, agents[day]),))
            assert [row["session_id"] for row in stored] == [evening[day]] * 2
            links = rows(db_path, "SELECT visitor_id FROM session_links WHERE session_id = ?"
                                  " ORDER BY visitor_id", (evening[day],))
            assert sorted(row["visitor_id"] for row in links) == sorted(
                [expected[2 * n], stored[0]["visitor_id"]])
        sessions = rows(db_path, "SELECT id, pageviews FROM sessions ORDER BY id")
        # Three visits of three pageviews each, and the visitor after the saltless day's
        # own new one.
        assert [row["pageviews"] for row in sessions] == [3, 3, 3, 1]
        assert {row["id"] for row in sessions[:3]} == set(evening.values())
        new = rows(db_path, "SELECT session_id FROM events WHERE visitor_id = ?",
                   (visitor_id(db.conn(), no_salt_day, FIREFOX),))
        assert [row["session_id"] for row in new] == [sessions[3]["id"]]
    finally:
        db.close()
