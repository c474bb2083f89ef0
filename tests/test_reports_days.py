"""Traffic per day: final days are stored once and read back, other days are counted live.

Events go in through the real endpoint on four consecutive days (the fake clock moves a
day at a time, so each day has its own visitor salt); the reports are then asked at
chosen instants.
"""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal

import pytest
import webtest

from app import create_app
from reports.days import queries, traffic_days
from reports.days.ahead import BREAKDOWNS
from reports.days.queries import DIMENSIONS
from reports.shared.params import DateRange
from tests.conftest import WAIT, WriteLock, bearer, connect, delete_unchecked

DAY = 86_400
FIRST_DAY = 1_789_948_800  # 2026-09-21T00:00:00Z
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
RANGE = "from=2026-09-21&to=2026-09-24"


@pytest.fixture
def traffic(client, tally, site, clock, db_path):
    """Four days of visits: on day d (0-3), d + 1 visitors, each with a pageview of / from
    Google, a pageview of /day-d and a signup one minute later."""
    headers = bearer(site["key"])
    site_id = site["site"]["id"]
    tally.start()
    for day in range(4):
        clock.set(FIRST_DAY + day * DAY + 12 * 3600)
        now_ms = int(clock() * 1000)
        batch = []
        for visitor in range(day + 1):
            who = {"ip": f"81.2.69.{140 + visitor}", "ua": FIREFOX}
            batch += [
                {"e": "pageview", "u": "https://example.com/", "r": "https://www.google.com/",
                 "ts": now_ms - 120_000, **who},
                {"e": "pageview", "u": f"https://example.com/day-{day}", "ts": now_ms - 60_000,
                 **who},
                {"e": "signup", "u": f"https://example.com/day-{day}", "ts": now_ms, **who},
            ]
        client.post_json("/api/v1/events", {"s": site_id, "b": batch}, headers=headers,
                         status=204)
        assert tally.flusher.flush_now(timeout=WAIT)

    conn = connect(db_path)

    class Traffic:
        db = conn

        def get(self, path, at):
            clock.set(at)
            resp = client.get(path, headers=headers)
            return json.loads(resp.body, parse_float=Decimal)["data"]

        headers = bearer(site["key"])

        def stored_days(self):
            return [r[0] for r in self.db.execute("SELECT day FROM traffic_days ORDER BY day")]

    yield Traffic()
    conn.close()


def rows(data):
    return [(r["value"], r["visitors"], r["pageviews"], r["events"]) for r in data["rows"]]


EXPECTED_AGGREGATE = {
    # 1 + 2 + 3 + 4 visitors, two pageviews and a signup each, one two-minute visit each.
    "from": "2026-09-21", "to": "2026-09-24", "visitors": 10, "pageviews": 20, "sessions": 10,
    "events": 10, "bounce_rate": Decimal("0.0"), "avg_session_seconds": Decimal("120.0"),
}
EXPECTED_PAGES = [("/", 10, 10, 0), ("/day-3", 4, 4, 4), ("/day-2", 3, 3, 3),
                  ("/day-1", 2, 2, 2), ("/day-0", 1, 1, 1)]


def test_final_days_are_stored_and_give_the_live_figures(traffic):
    # On day 3 at noon only day 0 and 1 can be final (a day is final one day after it ends).
    on_day_3 = FIRST_DAY + 3 * DAY + 13 * 3600
    assert traffic.get(f"/api/v1/stats/aggregate?{RANGE}", on_day_3) == EXPECTED_AGGREGATE
    first = FIRST_DAY // DAY
    assert traffic.stored_days() == [first, first + 1]
    assert rows(traffic.get(f"/api/v1/stats/breakdown?by=page&{RANGE}", on_day_3)) == EXPECTED_PAGES
    # Days later, every day is final; stored and live days together give the same figures.
    later = FIRST_DAY + 9 * DAY
    assert traffic.get(f"/api/v1/stats/aggregate?{RANGE}", later) == EXPECTED_AGGREGATE
    assert traffic.stored_days() == [first, first + 1, first + 2, first + 3]
    assert rows(traffic.get(f"/api/v1/stats/breakdown?by=page&{RANGE}", later)) == EXPECTED_PAGES
    channels = traffic.get(f"/api/v1/stats/breakdown?by=channel&{RANGE}", later)
    assert rows(channels) == [("Organic Search", 10, 20, 10)]
    stored_dimensions = traffic.db.execute(
        "SELECT DISTINCT dimension FROM traffic_day_dimensions ORDER BY 1").fetchall()
    assert stored_dimensions == [("channel",), ("page",)]


def test_stored_days_are_read_not_recounted(traffic, db_path):
    later = FIRST_DAY + 9 * DAY
    traffic.get(f"/api/v1/stats/aggregate?{RANGE}", later)
    traffic.get(f"/api/v1/stats/breakdown?by=page&{RANGE}", later)
    # Were the events counted again, removing them would change the figures.
    delete_unchecked(db_path, "events", "sessions")
    assert traffic.get(f"/api/v1/stats/aggregate?{RANGE}", later) == EXPECTED_AGGREGATE
    assert rows(traffic.get(f"/api/v1/stats/breakdown?by=page&{RANGE}", later)) == EXPECTED_PAGES
    # A dimension never asked for was not stored: it is counted from what is left.
    assert rows(traffic.get(f"/api/v1/stats/breakdown?by=country&{RANGE}", later)) == []


def test_the_background_duty_counts_final_days_ahead_and_reports_read_them_after_a_restart(
        traffic, tally, clock, config, db_path):
    later = FIRST_DAY + 9 * DAY
    breakdowns = {by: rows(traffic.get(f"/api/v1/stats/breakdown?by={by}&{RANGE}", later))
                  for by in DIMENSIONS}
    delete_unchecked(db_path, "traffic_days", "traffic_day_dimensions", "traffic_day_values")
    clock.set(later)
    tally.db.release()  # the duty runs here, on the test's thread, as on the tasks thread
    assert tally.count_final_days() == len(BREAKDOWNS)  # one site: the totals, each breakdown
    # Every final day of the site's life, the empty ones after the traffic too: day 7 is
    # the newest final one on day 9.
    first = FIRST_DAY // DAY
    assert traffic.stored_days() == list(range(first, first + 8))
    stored = traffic.db.execute("SELECT DISTINCT dimension FROM traffic_day_dimensions").fetchall()
    assert sorted(row[0] for row in stored) == sorted(DIMENSIONS)
    # Were the events counted again, removing them would change the figures.
    delete_unchecked(db_path, "events", "sessions")
    assert traffic.get(f"/api/v1/stats/aggregate?{RANGE}", later) == EXPECTED_AGGREGATE
    for by, expected in breakdowns.items():
        assert rows(traffic.get(f"/api/v1/stats/breakdown?by={by}&{RANGE}", later)) == expected
    # A restarted service reads the same stored days.
    tally.stop(timeout=5)
    restarted = create_app(config, clock=clock)
    try:
        again = webtest.TestApp(restarted).get(f"/api/v1/stats/aggregate?{RANGE}",
                                               headers=traffic.headers)
        assert json.loads(again.body, parse_float=Decimal)["data"] == EXPECTED_AGGREGATE
    finally:
        restarted.stop(timeout=5)


def test_the_background_duty_skips_days_not_final_and_stops_when_tally_stops(
        traffic, tally, clock):
    # Two days after the last day's noon: days 0-1 are final, day 2 only just, day 3 not.
    clock.set(FIRST_DAY + 4 * DAY + 12 * 3600)
    tally.db.release()
    assert tally.count_final_days() == len(BREAKDOWNS)
    first = FIRST_DAY // DAY
    assert traffic.stored_days() == [first, first + 1, first + 2]
    tally.tasks.stop()
    assert tally.count_final_days() == 0


def test_the_duty_waits_its_turn_behind_other_reads_and_a_busy_machine_ends_its_turn(
        traffic, tally, clock, caplog):
    clock.set(FIRST_DAY + 9 * DAY)
    tally.db.release()
    with tally.read_gate.turn(first=True, wait=None), caplog.at_level("INFO", logger="tally"):
        # Another read holds the worker's turn for longer than the duty waits (the budget).
        assert tally.count_final_days() == 0
    assert "final days not counted ahead this time (other reads kept this one waiting" \
        in caplog.text
    assert traffic.stored_days() == []
    assert tally.count_final_days() == len(BREAKDOWNS)  # its next turn


def test_a_day_with_an_open_session_is_not_stored(traffic):
    # Day 0 is old enough, but one of its sessions was seen an hour before "now".
    on_day_2 = FIRST_DAY + 2 * DAY + 6 * 3600
    traffic.db.execute("UPDATE sessions SET last_seen_at = ? WHERE started_at < ?",
                       ((on_day_2 - 3600) * 1000, (FIRST_DAY + DAY) * 1000))
    traffic.get(f"/api/v1/stats/aggregate?{RANGE}", on_day_2)
    assert traffic.stored_days() == []
    traffic.get(f"/api/v1/stats/aggregate?{RANGE}", on_day_2 + 3 * 3600)
    assert traffic.stored_days() == [FIRST_DAY // DAY]


def test_a_busy_database_defers_storing_but_answers(traffic, db_path):
    holder = WriteLock(db_path)
    try:
        later = FIRST_DAY + 9 * DAY
        assert traffic.get(f"/api/v1/stats/aggregate?{RANGE}", later) == EXPECTED_AGGREGATE
        pages = traffic.get(f"/api/v1/stats/breakdown?by=page&{RANGE}", later)
        assert rows(pages) == EXPECTED_PAGES
    finally:
        holder.release()
    assert traffic.stored_days() == []
    traffic.get(f"/api/v1/stats/aggregate?{RANGE}", later)
    assert len(traffic.stored_days()) == 4


def test_every_breakdown_is_stored_and_read_back_alike(traffic):
    later = FIRST_DAY + 9 * DAY
    first = {by: traffic.get(f"/api/v1/stats/breakdown?by={by}&{RANGE}", later) for by in DIMENSIONS}
    stored = traffic.db.execute(
        "SELECT dimension, count(*) FROM traffic_day_dimensions GROUP BY 1").fetchall()
    assert sorted(stored) == sorted((by, 4) for by in DIMENSIONS)
    again = {by: traffic.get(f"/api/v1/stats/breakdown?by={by}&{RANGE}", later) for by in DIMENSIONS}
    assert again == first
    assert rows(first["event"]) == [("signup", 10, 0, 10)]
    assert rows(first["country"]) == [("GB", 10, 20, 10)]


def test_a_first_count_cut_short_keeps_the_days_it_stored(traffic, tally, monkeypatch):
    monkeypatch.setattr(traffic_days, "STORE_BATCH_DAYS", 1)
    real_count = queries.live_totals

    def count_until_the_third_day(conn, site_id, day):
        if day == FIRST_DAY // DAY + 2:
            raise TimeoutError("the worker timeout struck")
        return real_count(conn, site_id, day)

    monkeypatch.setattr(queries, "live_totals", count_until_the_third_day)
    site_id = tally.db.conn().execute("SELECT id FROM sites").fetchone()[0]
    days = traffic_days.TrafficDays(tally.db, site_id, (FIRST_DAY + 9 * DAY) * 1000)
    with pytest.raises(TimeoutError):
        days.totals(DateRange(date(2026, 9, 21), date(2026, 9, 24)))
    assert traffic.stored_days() == [FIRST_DAY // DAY, FIRST_DAY // DAY + 1]
