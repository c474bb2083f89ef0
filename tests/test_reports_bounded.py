"""Issue 26: reads cost what is stored and change nothing anonymous.

- Filters: a `~` filter is matched once against the stored values of its dimension and
  many buckets are counted by one statement; the figures are those of the statements
  before (tests/segments_reference.py), on random data and random filters.
- The site's life: days before the site existed or after today are empty without being
  counted, and never stored.
- Shared links: an anonymous viewer never stores a segment.
"""

from __future__ import annotations

import random
from datetime import date

import orjson
import pytest

from app import create_app
from reports.segments.filters import Filter, Goal, parse_filters
from reports.segments.queries import Segment, SegmentTotals, resolve
from reports.segments.segment_days import MAX_STORED_SEGMENTS, SegmentDays
from reports.service import run_report
from reports.shared.params import DateRange
from storage.events import EventRow
from storage.sessions import insert_sessions
from tests.conftest import FakeClock, config_for, execute, rows
from tests.segments_reference import Segment as ReferenceSegment
from tests.segments_reference import by_the_rules

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
FIRST_DAY = 20_717  # 2026-09-21
SITE_ID = 1

# Pools with ASCII and non-ASCII letters in both cases, so the case rules are exercised.
PAGES = ("/", "/Pricing", "/pricing/Team", "/docs/ÉTÉ", "/docs/été", "/blog/Straße",
         "/blog/STRASSE", "/a%20b", "/x_y")
SOURCES = (None, "Google", "google", "GOOGLE Ads", "newsletter", "Ünï", "ünï")
CHANNELS = ("Direct", "Organic Search", "Email", "Paid Search")
MEDIUMS = (None, "email", "EMAIL", "cpc")
CAMPAIGNS = (None, "Spring", "spring-2", "FALL")
COUNTRIES = (None, "GB", "DE", "FR")
BROWSERS = (None, "Firefox", "firefox", "Safari")
DEVICES = (None, "desktop", "mobile")
NAMES = ("pageview", "pageview", "pageview", "signup", "Download", "$identify")
PROPS = (None, {"plan": "Pro"}, {"plan": "pro team"}, {"plan": "FREE"}, {"n": 42},
         {"flag": True}, {"plan": None}, {"obj": {"plan": "x"}}, {"plan": "Été"})
NEEDLES = ("o", "O", "pri", "PRI", "été", "ÉTÉ", "strasse", "ß", "oo", "e", "/", "ünï",
           "zzz", "42", "1", "pro", "free", "%", "_")


def _event(rnd: random.Random, ts: int, session: int | None, visitor: int,
           name: str) -> tuple:
    page = rnd.choice(PAGES)
    props = rnd.choice(PROPS)
    return (EventRow(
        SITE_ID, ts, name, visitor, page, f"https://example.com{page}",
        rnd.choice(("example.com", "Example.com", "docs.example.com")), None, None, None,
        None, None, "u1" if name == "$identify" else None,
        None if props is None else orjson.dumps(props).decode(), rnd.choice(COUNTRIES),
        rnd.choice(BROWSERS), None, rnd.choice(DEVICES), None, None, None, None, None, None,
        None, None, None, None, None), session)


def seed_traffic(db, seed: int, sessions: int = 60) -> None:
    """Random sessions over three days with their events: most short, some lasting more
    than a day, a few with an event dated before their start, and `$identify` events
    without a session."""
    rnd = random.Random(seed)
    start = FIRST_DAY * DAY_MS
    session_rows, events = [], []
    for n in range(sessions):
        session_id = 1000 * seed + n + 1
        started = start + rnd.randrange(3 * DAY_MS)
        visitor = rnd.randrange(1, 15)
        offsets = sorted(rnd.randrange(0, 40 * 60_000) for _ in range(rnd.randint(0, 5)))
        if rnd.random() < 0.15:
            offsets.append(rnd.randrange(20, 30) * HOUR_MS)  # a day later
        if rnd.random() < 0.05:
            offsets.append(-rnd.randrange(1, 3) * HOUR_MS)  # before its start
        stamps = [started] + [started + o for o in offsets]
        names = ["pageview"] + [rnd.choice(NAMES[:-1]) for _ in offsets]
        for ts, name in zip(stamps, names, strict=True):
            events.append(_event(rnd, ts, session_id, visitor, name))
        pageviews = names.count("pageview")
        entry = rnd.choice(PAGES)
        session_rows.append((
            session_id, SITE_ID, visitor, started, max(stamps), rnd.choice(CHANNELS),
            rnd.choice(SOURCES), None, f"https://example.com{entry}", entry, None,
            rnd.choice(MEDIUMS), rnd.choice(CAMPAIGNS), None, None, pageviews,
            len(names) - pageviews))
    for _ in range(10):
        events.append(_event(rnd, start + rnd.randrange(3 * DAY_MS), None, 99, "$identify"))
    events.sort(key=lambda e: e[0].ts)
    from storage.events import insert_events

    with db.transaction() as conn:
        insert_sessions(conn, session_rows)
        insert_events(conn, [e for e, _ in events], [s for _, s in events])


def random_filters(rnd: random.Random) -> tuple[tuple[Filter, ...], Goal | None]:
    dimensions = ("page", "hostname", "country", "browser", "device", "event", "source",
                  "channel", "medium", "campaign", "entry_page", "prop")
    chosen = []
    for _ in range(rnd.randint(1, 4)):
        dimension = rnd.choice(dimensions)
        operator = rnd.choice(("~", "~", "~", "==", "!="))
        if operator == "~":
            values = rnd.sample(NEEDLES, rnd.randint(1, 4))
        else:
            pool = {"page": PAGES, "source": SOURCES, "channel": CHANNELS, "medium": MEDIUMS,
                    "campaign": CAMPAIGNS, "entry_page": PAGES, "country": COUNTRIES,
                    "browser": BROWSERS, "device": DEVICES, "event": NAMES,
                    "hostname": ("example.com", "docs.example.com"),
                    "prop": ("Pro", "pro team", "42", "1", "FREE")}[dimension]
            values = rnd.sample([v for v in pool if v is not None], 2)
        chosen.append(Filter(dimension, operator, tuple(sorted(set(values))),
                             rnd.choice(("plan", "n", "flag")) if dimension == "prop" else None))
    goal = rnd.choice((None, None, Goal("event", "signup"), Goal("page", "/Pricing")))
    return tuple(chosen), goal


@pytest.mark.parametrize("seed", [1, 2])
def test_filtered_figures_are_those_of_the_statements_before(store, seed):
    seed_traffic(store, seed)
    conn = store.conn()
    rnd = random.Random(100 + seed)
    first, last = FIRST_DAY - 1, FIRST_DAY + 3
    start, end = first * DAY_MS, (last + 1) * DAY_MS
    compared = 0
    for _ in range(30):
        filters, goal = random_filters(rnd)
        reference = ReferenceSegment(by_the_rules(conn, SITE_ID, filters), goal)
        segment = Segment(resolve(conn, SITE_ID, filters, start, end + DAY_MS), goal)
        days = segment.bucket_totals(conn, SITE_ID, start, end, DAY_MS)
        for i, day in enumerate(range(first, last + 1)):
            expected = reference.totals(conn, SITE_ID, day * DAY_MS, (day + 1) * DAY_MS)
            assert days.get(i, SegmentTotals()) == expected, (filters, goal, day)
        hour_start = (FIRST_DAY + 1) * DAY_MS
        hours = segment.bucket_totals(conn, SITE_ID, hour_start, hour_start + DAY_MS, HOUR_MS)
        for hour in range(24):
            t0 = hour_start + hour * HOUR_MS
            expected = reference.totals(conn, SITE_ID, t0, t0 + HOUR_MS)
            assert hours.get(hour, SegmentTotals()) == expected, (filters, goal, hour)
        by = rnd.choice(("page", "source", "country", "event", "entry_page", "channel"))
        for day in range(first, last + 1):
            t0 = day * DAY_MS
            assert sorted(segment.values(conn, SITE_ID, t0, t0 + DAY_MS, by), key=repr) == \
                sorted(reference.values(conn, SITE_ID, t0, t0 + DAY_MS, by), key=repr)
        # The whole path of a report: stored values matched once, days in runs, nothing kept.
        period = DateRange(date(2026, 9, 20), date(2026, 9, 24))
        live = SegmentDays(store, SITE_ID, (last + 5) * DAY_MS, filters, goal, stores=False)
        assert live.day_totals(period) == {
            day: reference.totals(conn, SITE_ID, day * DAY_MS, (day + 1) * DAY_MS)
            for day in range(first, last + 1)}
        compared += 1
    assert compared == 30
    assert rows_of(store, "traffic_segments") == 0


def rows_of(db, table: str) -> int:
    return db.conn().execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608 - fixed names


def test_a_contains_filter_is_matched_against_the_stored_values_once(store):
    """Ten `page~` filters of twenty values each: one statement lists the pages that
    contain one value of each, and the rows are then kept by membership."""
    seed_traffic(store, 3)
    conn = store.conn()
    filters = parse_filters({"filters": ";".join(
        "page~" + "|".join([f"q{chr(97 + i)}{k}" for i in range(19)] + ["/"])
        for k in range(10))})
    resolved = resolve(conn, SITE_ID, filters, FIRST_DAY * DAY_MS, (FIRST_DAY + 4) * DAY_MS)
    assert resolved == (Filter("page", "==", tuple(sorted(PAGES))),)


# The site's life ----------------------------------------------------------------------------

def _stored_rows(db_path: str) -> dict[str, int]:
    return {table: rows(db_path, f"SELECT count(*) AS n FROM {table}")[0]["n"]  # noqa: S608 - fixed names
            for table in ("traffic_days", "traffic_day_dimensions", "traffic_day_values",
                          "traffic_segments", "traffic_segment_days",
                          "traffic_segment_values")}


def test_days_before_the_site_or_after_today_are_empty_and_never_stored(store, db_path):
    seed_traffic(store, 4)
    now = (FIRST_DAY + 6) * DAY_MS / 1000
    store.conn().execute("UPDATE sites SET created_at = ? WHERE id = 1",
                         ((FIRST_DAY - 2) * DAY_MS + 12 * HOUR_MS,))
    before = _stored_rows(db_path)
    for params in ({"from": "0001-01-01", "to": "0001-12-31"},
                   {"from": "2021-01-01", "to": "2021-12-31", "filters": "page~pri"},
                   {"from": "9999-01-01", "to": "9999-12-31"}):
        aggregate = run_report("aggregate", store, SITE_ID, params, now)
        assert (aggregate["from"], aggregate["to"]) == (params["from"], params["to"])
        assert aggregate["visitors"] == aggregate["pageviews"] == aggregate["sessions"] == 0
        series = run_report("timeseries", store, SITE_ID, params, now)
        assert len(series["rows"]) == 365 and all(r["visitors"] == 0 for r in series["rows"])
        breakdown = run_report("breakdown", store, SITE_ID, {**params, "by": "page"}, now)
        assert breakdown["rows"] == []
    hours = run_report("timeseries", store, SITE_ID,
                       {"from": "0001-01-01", "to": "0001-01-31", "interval": "hour",
                        "filters": "source~o"}, now)
    assert len(hours["rows"]) == 31 * 24
    assert _stored_rows(db_path) == before
    # A range across the site's creation counts and stores only the days of its life.
    period = {"from": "2026-09-01", "to": "2026-09-30"}
    whole = run_report("aggregate", store, SITE_ID, period, now)
    alive = run_report("aggregate", store, SITE_ID, {"from": "2026-09-19", "to": "2026-09-27"},
                       now)
    assert whole["visitors"] == alive["visitors"] > 0
    stored_days = [r["day"] for r in rows(db_path, "SELECT day FROM traffic_days")]
    assert min(stored_days) == FIRST_DAY - 2 and max(stored_days) == FIRST_DAY + 4


def test_traffic_stored_before_the_site_was_created_still_counts(store, db_path):
    """A copied or restored database can hold events older than the site's row: its first
    stored event starts its life."""
    seed_traffic(store, 5)
    store.conn().execute("UPDATE sites SET created_at = ? WHERE id = 1",
                         ((FIRST_DAY + 10) * DAY_MS,))
    now = (FIRST_DAY + 12) * DAY_MS / 1000
    figures = run_report("aggregate", store, SITE_ID,
                         {"from": "2026-09-21", "to": "2026-09-24"}, now)
    total = rows(db_path, "SELECT count(*) AS n FROM sessions")[0]["n"]
    assert figures["sessions"] == total


def test_revenue_before_the_site_was_created_still_counts(client, site, tally, clock, db_path):
    """Payments keep their own dates (a backfill, a Stripe history): money reports are not
    cut to the site's life, only traffic is."""
    from tests.conftest import bearer

    headers = bearer(site["key"])
    client.post_json("/api/v1/payments", {
        "payment_id": "p_old", "customer": {"id": "c1"}, "amount": 120, "currency": "EUR",
        "kind": "charge", "paid_at": "2020-03-05T10:00:00Z",
        "subscription": {"id": "s1", "amount": 120, "interval": "year",
                         "started_at": "2020-03-05T10:00:00Z"}}, headers=headers)
    revenue = client.get("/api/v1/stats/revenue?from=2020-03-01&to=2020-03-31",
                         headers=headers).json["data"]
    assert revenue["currencies"]["EUR"]["net"] == 120
    mrr = client.get("/api/v1/stats/mrr?at=2020-04-01", headers=headers).json["data"]
    assert mrr["currencies"]["EUR"]["mrr"] == 10
    series = client.get("/api/v1/stats/timeseries?from=2020-03-01&to=2020-03-31",
                        headers=headers).json["data"]
    assert sum(r["revenue"].get("EUR", {}).get("net", 0) for r in series["rows"]) == 120
    assert sum(r["visitors"] for r in series["rows"]) == 0


# Shared links -------------------------------------------------------------------------------

def test_shared_link_viewers_never_store_a_segment(db_path, tmp_path):
    """Shared-link views with distinct filters leave the site's segments as they were,
    while the site has room for more and once it holds MAX_STORED_SEGMENTS (the views are
    still answered, counted live); after a restart on the same database the link reads
    the same figures."""
    from storage.backend import open_database
    from storage.directory import Directory
    from storage.shares import SharedLinks

    clock = FakeClock((FIRST_DAY + 6) * 86_400)
    db = open_database(config_for(db_path))
    directory = Directory(db, clock)
    account = directory.create_account("A", "growth")
    site = directory.create_site(account["id"], ["example.com"])
    site_id = directory.find_site(site["id"]).id
    assert site_id == SITE_ID
    db.conn().execute("UPDATE sites SET created_at = ? WHERE id = ?",
                      ((FIRST_DAY - 1) * DAY_MS, site_id))
    seed_traffic(db, 6)
    token = SharedLinks(db, clock).create(site["id"], revenue=False)["token"]
    db.close()

    app = create_app(config_for(db_path), clock=clock)
    import webtest

    client = webtest.TestApp(app)
    period = "from=2026-09-20&to=2026-09-24"
    def view_distinct_filters(first: int) -> None:
        for n in range(first, first + 5):
            page = client.get(f"/share/{token}?{period}&filters=page~{n}|o", expect_errors=True)
            assert page.status_int == 200, page.text[:500]

    assert rows(db_path, "SELECT count(*) AS n FROM traffic_segments")[0]["n"] == 0
    view_distinct_filters(0)
    assert rows(db_path, "SELECT count(*) AS n FROM traffic_segments")[0]["n"] == 0
    # The owner's views have filled the site's room for stored segments.
    for n in range(MAX_STORED_SEGMENTS):
        execute(db_path, "INSERT INTO traffic_segments (site_id, segment, created_at)"
                         " VALUES (?, ?, 0)", (site_id, f"owner-segment-{n}"))
    before = MAX_STORED_SEGMENTS
    view_distinct_filters(5)
    assert rows(db_path, "SELECT count(*) AS n FROM traffic_segments")[0]["n"] == before
    assert rows(db_path, "SELECT count(*) AS n FROM traffic_segment_days")[0]["n"] == 0
    shared = client.get(f"/share/{token}?{period}&filters=page~pri").text
    app.stop(timeout=5)

    restarted = create_app(config_for(db_path), clock=clock)
    try:
        again = webtest.TestApp(restarted).get(f"/share/{token}?{period}&filters=page~pri").text
        assert again == shared
        assert rows(db_path, "SELECT count(*) AS n FROM traffic_segments")[0]["n"] == before
    finally:
        restarted.stop(timeout=5)


def test_an_owner_view_stores_its_segment_and_a_shared_link_then_reads_it(store, db_path):
    seed_traffic(store, 7)
    now = (FIRST_DAY + 6) * DAY_MS / 1000
    params = {"from": "2026-09-20", "to": "2026-09-24", "filters": "page~pri|doc"}
    owner = run_report("aggregate", store, SITE_ID, params, now)
    stored = rows(db_path, "SELECT segment, count(*) AS n FROM traffic_segment_days"
                           " GROUP BY segment")
    assert [r["segment"] for r in stored] == ["page~doc|pri"] and stored[0]["n"] == 5
    # The same figures, read from the stored days by the anonymous viewer.
    store.conn().execute("DELETE FROM events")
    assert run_report("aggregate", store, SITE_ID, params, now, stores_segments=False) == owner
    assert rows(db_path, "SELECT count(*) AS n FROM traffic_segments")[0]["n"] == 1

