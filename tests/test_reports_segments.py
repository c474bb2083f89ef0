"""Filters, goals, comparisons and the time series over HTTP, against references computed
in Python from the visits sent.

Each visitor makes one visit a day (a few pageviews 30 s apart, maybe a signup with a
`plan` property), so every visit is one session and the reference needs no sessionizer.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from reports.segments import segment_days as segments
from reports.traffic.figures import SessionTotals, traffic_aggregate
from tests.conftest import WAIT, bearer, connect, delete_unchecked

DAY = 86_400
FIRST_DAY = 1_789_948_800  # 2026-09-21T00:00:00Z
RANGE = "from=2026-09-21&to=2026-09-23"
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
IPHONE = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, "
          "like Gecko) Version/17.0 Mobile/15E148 Safari/604.1")
KINDS = {  # how a visit arrives -> (source, channel, medium)
    "google": ("Google", "Organic Search", None),
    "newsletter": ("newsletter", "Email", "email"),
    "direct": (None, "Direct", None),
}


def make_visits(seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    visits = []
    for day in range(3):
        for visitor in range(7):
            kind = rng.choice(list(KINDS))
            pages = rng.sample(["/", "/pricing", "/docs", "/blog"], rng.randint(1, 3))
            customs = [("signup", {"plan": rng.choice(["pro", "free"])})] \
                if rng.random() < 0.5 else []
            source, channel, medium = KINDS[kind]
            visits.append({
                "day": day, "ip": f"81.2.69.{140 + visitor}", "mobile": visitor % 2 == 1,
                "kind": kind, "source": source, "channel": channel, "medium": medium,
                "entry_page": pages[0], "pages": pages, "customs": customs,
            })
    return visits


VISITS = make_visits()


def visit_events(visit: dict) -> list[dict]:
    """The visit's events as the reference sees them: name, page, props, seconds into it."""
    events = [{"event": "pageview", "page": p, "props": {}, "at": 30 * i}
              for i, p in enumerate(visit["pages"])]
    last = len(events)
    events += [{"event": name, "page": visit["pages"][-1], "props": props, "at": 30 * (last + i)}
               for i, (name, props) in enumerate(visit["customs"])]
    for e in events:
        e.update(hostname="example.com", country="GB",
                 device="mobile" if visit["mobile"] else "desktop")
    return events


@pytest.fixture
def site_traffic(client, tally, site, clock, db_path):
    headers = bearer(site["key"])
    site_id = site["site"]["id"]
    tally.start()
    for day in range(3):
        clock.set(FIRST_DAY + day * DAY + 12 * 3600)
        start_ms = int(clock() * 1000) - 600_000
        batch = []
        for visit in (v for v in VISITS if v["day"] == day):
            who = {"ip": visit["ip"], "ua": IPHONE if visit["mobile"] else FIREFOX}
            for i, e in enumerate(visit_events(visit)):
                query = "?utm_source=newsletter&utm_medium=email" \
                    if visit["kind"] == "newsletter" and i == 0 else ""
                body = {"e": e["event"], "u": f"https://example.com{e['page']}{query}",
                        "ts": start_ms + e["at"] * 1000, **who}
                if visit["kind"] == "google" and i == 0:
                    body["r"] = "https://www.google.com/"
                if e["props"]:
                    body["p"] = e["props"]
                batch.append(body)
        client.post_json("/api/v1/events", {"s": site_id, "b": batch}, headers=headers,
                         status=204)
        assert tally.flusher.flush_now(timeout=WAIT)

    conn = connect(db_path)

    class Traffic:
        db = conn
        url = db_path

        def get(self, path, at=FIRST_DAY + 2 * DAY + 18 * 3600, status=200):
            clock.set(at)
            resp = client.get(path, headers=headers, expect_errors=True)
            assert resp.status_int == status, resp.body
            return json.loads(resp.body, parse_float=Decimal)

        def data(self, path, **kwargs):
            return self.get(path, **kwargs)["data"]

    yield Traffic()
    conn.close()


# Filters as the API takes them, and as Python predicates over (visit, event).
def _is(values):
    return lambda v: v is not None and v in values


def _not(values):
    return lambda v: v is None or v not in values


def _contains(parts):
    return lambda v: v is not None and any(p.lower() in v.lower() for p in parts)


SESSION_KEYS = {"source", "channel", "medium", "entry_page"}
FILTERS = {
    "source==Google": [("source", _is({"Google"}))],
    "visit:channel!=Direct": [("channel", _not({"Direct"}))],
    "source~GOO|news": [("source", _contains(["GOO", "news"]))],
    "medium==email": [("medium", _is({"email"}))],
    "entry_page==/|/docs": [("entry_page", _is({"/", "/docs"}))],
    "event:page==/pricing": [("page", _is({"/pricing"}))],
    "page!=/blog;device==mobile": [("page", _not({"/blog"})), ("device", _is({"mobile"}))],
    "event==signup": [("event", _is({"signup"}))],
    "prop:plan==pro": [("prop:plan", _is({"pro"}))],
    "prop:plan!=pro": [("prop:plan", _not({"pro"}))],
    "source==Google;page~pric": [("source", _is({"Google"})), ("page", _contains(["pric"]))],
    "country==GB;hostname==example.com": [("country", _is({"GB"})),
                                          ("hostname", _is({"example.com"}))],
}


def _event_value(event, key):
    return event["props"].get(key[5:]) if key.startswith("prop:") else event[key]


def reference_day(day: int, filters, goal=None) -> dict:
    """Per-day figures by their README definitions, from VISITS."""
    session_filters = [(k, f) for k, f in filters if k in SESSION_KEYS]
    event_filters = [(k, f) for k, f in filters if k not in SESSION_KEYS]
    pageviews = events = 0
    sessions, conversions, goal_events = [], set(), 0
    for visit in (v for v in VISITS if v["day"] == day):
        if not all(f(visit[k]) for k, f in session_filters):
            continue
        all_events = visit_events(visit)
        matching = [e for e in all_events
                    if all(f(_event_value(e, k)) for k, f in event_filters)]
        pageviews += sum(e["event"] == "pageview" for e in matching)
        events += sum(e["event"] != "pageview" for e in matching)
        if not matching:
            continue
        sessions.append((visit, all_events))
        if goal is not None:
            done = [e for e in all_events if goal(e)]
            goal_events += len(done)
            if done:
                conversions.add(visit["ip"])
    totals = SessionTotals(
        visitors=len({v["ip"] for v, _ in sessions}), pageviews=pageviews,
        sessions=len(sessions), events=events,
        bounces=sum(len(v["pages"]) == 1 and not v["customs"] for v, _ in sessions),
        duration_ms=sum(max(e["at"] for e in evs) * 1000 for _, evs in sessions))
    figures = traffic_aggregate(totals)
    if goal is not None:
        rate = round(len(conversions) / totals.visitors, 4) if totals.visitors else 0.0
        figures.update(conversions=len(conversions), conversion_rate=rate, goal_events=goal_events)
    return figures


def reference_range(days, filters, goal=None) -> dict:
    parts = [reference_day(d, filters, goal) for d in days]
    visits = [v for v in VISITS if v["day"] in days]
    assert visits
    sums = {k: sum(p[k] for p in parts) for k in ("visitors", "pageviews", "sessions", "events")}
    return sums


def traffic_counts(figures: dict) -> dict:
    return {k: figures[k] for k in ("visitors", "pageviews", "sessions", "events")}


def as_floats(figures: dict) -> dict:
    return {k: float(v) if isinstance(v, Decimal) else v for k, v in figures.items()}


@pytest.mark.parametrize("raw", list(FILTERS))
def test_filtered_series_and_aggregate_match_the_reference(site_traffic, raw):
    filters = FILTERS[raw]
    series = site_traffic.data(f"/api/v1/stats/timeseries?{RANGE}&filters={raw}")
    rows = series["rows"]
    assert [r["start"] for r in rows] == ["2026-09-21", "2026-09-22", "2026-09-23"]
    for day, row in enumerate(rows):
        expected = reference_day(day, filters)
        assert as_floats({k: row[k] for k in expected}) == expected, (raw, day)
        assert row["revenue"] == {}
    aggregate = site_traffic.data(f"/api/v1/stats/aggregate?{RANGE}&filters={raw}")
    assert traffic_counts(aggregate) == reference_range(range(3), filters)
    # Day buckets add up to the aggregate over the same range.
    for figure in ("visitors", "pageviews", "sessions", "events"):
        assert sum(r[figure] for r in rows) == aggregate[figure]
    assert aggregate["filters"] == series["filters"]


def test_unfiltered_day_buckets_add_up_to_the_aggregate(site_traffic):
    rows = site_traffic.data(f"/api/v1/stats/timeseries?{RANGE}")["rows"]
    aggregate = site_traffic.data(f"/api/v1/stats/aggregate?{RANGE}")
    for figure in ("visitors", "pageviews", "sessions", "events"):
        assert sum(r[figure] for r in rows) == aggregate[figure]
    assert traffic_counts(aggregate) == reference_range(range(3), [])
    weekly = site_traffic.data(f"/api/v1/stats/timeseries?{RANGE}&interval=week")["rows"]
    # 2026-09-21 is a Monday: one week, clipped to the range.
    assert [r["start"] for r in weekly] == ["2026-09-21"]
    assert traffic_counts(weekly[0]) == traffic_counts(aggregate)
    monthly = site_traffic.data("/api/v1/stats/timeseries?from=2026-09-21&to=2026-10-02"
                                "&interval=month")["rows"]
    assert [r["start"] for r in monthly] == ["2026-09-21", "2026-10-01"]
    assert traffic_counts(monthly[0]) == traffic_counts(aggregate)


def test_hours_of_a_day_add_up_to_its_pageviews_and_events(site_traffic):
    day = "from=2026-09-22&to=2026-09-22"
    hours = site_traffic.data(f"/api/v1/stats/timeseries?{day}&interval=hour")["rows"]
    assert len(hours) == 24 and hours[11]["start"] == "2026-09-22T11:00:00Z"
    expected = reference_day(1, [])
    assert sum(h["pageviews"] for h in hours) == expected["pageviews"]
    assert sum(h["events"] for h in hours) == expected["events"]
    assert sum(h["sessions"] for h in hours) == expected["sessions"]
    assert {h["start"] for h in hours if h["sessions"]} == {"2026-09-22T11:00:00Z"}


@pytest.mark.parametrize(("goal", "predicate"), [
    ("signup", lambda e: e["event"] == "signup"),
    ("page:/pricing", lambda e: e["event"] == "pageview" and e["page"] == "/pricing"),
])
@pytest.mark.parametrize("raw", ["", "source==Google", "page==/docs"])
def test_goal_conversions_match_the_reference(site_traffic, goal, predicate, raw):
    filters = FILTERS.get(raw, []) if raw else []
    if raw == "page==/docs":
        filters = [("page", _is({"/docs"}))]
    query = f"{RANGE}&goal={goal}" + (f"&filters={raw}" if raw else "")
    rows = site_traffic.data(f"/api/v1/stats/timeseries?{query}")["rows"]
    for day, row in enumerate(rows):
        expected = reference_day(day, filters, predicate)
        assert as_floats({k: row[k] for k in expected}) == expected
    aggregate = site_traffic.data(f"/api/v1/stats/aggregate?{query}")
    assert aggregate["goal"] == goal
    assert aggregate["conversions"] == sum(r["conversions"] for r in rows)
    assert aggregate["goal_events"] == sum(r["goal_events"] for r in rows)
    assert aggregate["conversion_rate"] == Decimal(
        str(round(aggregate["conversions"] / aggregate["visitors"], 4)))


def reference_breakdown(by: str, filters, goal=None, days=None) -> list[tuple]:
    """(value, visitors, pageviews, events[, conversions, goal_events]) for an event dimension
    (over the visits of `days`, day numbers from FIRST_DAY; all of them by default)."""
    rows: dict = {}
    for visit in VISITS:
        if days is not None and visit["day"] not in days:
            continue
        if not all(f(visit[k]) for k, f in filters if k in SESSION_KEYS):
            continue
        all_events = visit_events(visit)
        converted = goal is not None and any(goal(e) for e in all_events)
        for e in all_events:
            if not all(f(_event_value(e, k)) for k, f in filters if k not in SESSION_KEYS):
                continue
            row = rows.setdefault(e[by], {"visitors": set(), "pageviews": 0, "events": 0,
                                          "conversions": set(), "goal_events": 0})
            row["visitors"].add((visit["day"], visit["ip"]))
            row["pageviews" if e["event"] == "pageview" else "events"] += 1
            if converted:
                row["conversions"].add((visit["day"], visit["ip"]))
            row["goal_events"] += bool(goal and goal(e))
    result = [(value, len(r["visitors"]), r["pageviews"], r["events"])
              + ((len(r["conversions"]), r["goal_events"]) if goal else ())
              for value, r in rows.items()]
    return sorted(result, key=lambda r: (-r[1], r[0]))


@pytest.mark.parametrize("raw", ["source==Google", "visit:channel!=Direct",
                                 "page!=/blog;device==mobile"])
def test_filtered_breakdown_by_page_matches_the_reference(site_traffic, raw):
    data = site_traffic.data(f"/api/v1/stats/breakdown?by=page&{RANGE}&filters={raw}")
    got = [(r["value"], r["visitors"], r["pageviews"], r["events"]) for r in data["rows"]]
    assert got == reference_breakdown("page", FILTERS[raw])
    signup = lambda e: e["event"] == "signup"  # noqa: E731
    data = site_traffic.data(f"/api/v1/stats/breakdown?by=page&{RANGE}&filters={raw}&goal=signup")
    got = [(r["value"], r["visitors"], r["pageviews"], r["events"], r["conversions"],
            r["goal_events"]) for r in data["rows"]]
    assert got == reference_breakdown("page", FILTERS[raw], signup)


def test_filtered_breakdown_by_source_counts_the_segment_sessions(site_traffic):
    data = site_traffic.data(f"/api/v1/stats/breakdown?by=source&{RANGE}&filters=page==/docs")
    expected: dict = {}
    for visit in VISITS:
        if "/docs" in visit["pages"]:
            row = expected.setdefault(visit["source"], [set(), 0, 0])
            row[0].add((visit["day"], visit["ip"]))
            row[1] += len(visit["pages"])
            row[2] += len(visit["customs"])
    want = sorted(((k, len(v[0]), v[1], v[2]) for k, v in expected.items()),
                  key=lambda r: (-r[1], r[0] is None, r[0] or ""))
    assert [(r["value"], r["visitors"], r["pageviews"], r["events"]) for r in data["rows"]] == want


def test_compare_with_the_previous_period_and_year(site_traffic):
    data = site_traffic.data("/api/v1/stats/aggregate?from=2026-09-23&to=2026-09-23"
                             "&compare=previous_period&filters=channel!=Direct")
    assert (data["compare"]["from"], data["compare"]["to"]) == ("2026-09-22", "2026-09-22")
    now, before = reference_day(2, FILTERS["visit:channel!=Direct"]), \
        reference_day(1, FILTERS["visit:channel!=Direct"])
    assert traffic_counts(data) == traffic_counts(now)
    assert traffic_counts(data["compare"]) == traffic_counts(before)
    for figure in ("visitors", "pageviews", "sessions", "events"):
        ratio = Decimal(str(round((now[figure] - before[figure]) / before[figure], 4)))
        assert data["change"][figure] == ratio
    assert data["change"]["bounce_rate"] == Decimal(
        str(round(now["bounce_rate"] - before["bounce_rate"], 4)))
    series = site_traffic.data("/api/v1/stats/timeseries?from=2026-09-22&to=2026-09-23"
                               "&compare=previous_period")
    assert [r["start"] for r in series["compare"]["rows"]] == ["2026-09-20", "2026-09-21"]
    assert series["compare"]["rows"][1]["visitors"] == reference_day(0, [])["visitors"]
    assert len(series["change"]) == 2 and series["change"][0]["visitors"] is None
    year = site_traffic.data(f"/api/v1/stats/aggregate?{RANGE}&compare=previous_year")
    assert (year["compare"]["from"], year["compare"]["to"]) == ("2025-09-21", "2025-09-23")
    assert year["compare"]["visitors"] == 0 and year["change"]["visitors"] is None


def test_final_days_of_a_segment_are_stored_and_read_back(site_traffic):
    later = FIRST_DAY + 9 * DAY
    path = f"/api/v1/stats/aggregate?{RANGE}&filters=source==Google&goal=signup"
    pages = f"/api/v1/stats/breakdown?by=page&{RANGE}&filters=source==Google"
    first, first_pages = site_traffic.data(path, at=later), site_traffic.data(pages, at=later)
    stored = site_traffic.db.execute(
        "SELECT segment, count(*) FROM traffic_segment_days GROUP BY segment").fetchall()
    assert stored == [("source==Google#goal=signup", 3)]
    delete_unchecked(site_traffic.url, "events", "sessions")
    assert site_traffic.data(path, at=later) == first
    assert site_traffic.data(pages, at=later) == first_pages
    assert site_traffic.data(f"/api/v1/stats/aggregate?{RANGE}&filters=source==Bing",
                             at=later)["visitors"] == 0


@pytest.mark.parametrize("by", ["page", "device"])
def test_a_breakdown_counted_for_several_days_at_once_stores_each_days_own_figures(
        site_traffic, by):
    """The range's days are counted in one statement, then stored a day each: every day
    read back alone, from what was stored, is that day's own breakdown."""
    later = FIRST_DAY + 9 * DAY
    raw = "visit:channel!=Direct"
    site_traffic.data(f"/api/v1/stats/breakdown?by={by}&{RANGE}&filters={raw}", at=later)
    delete_unchecked(site_traffic.url, "events", "sessions")
    for day in range(3):
        date = datetime.fromtimestamp(FIRST_DAY + day * DAY, UTC).date()
        data = site_traffic.data(f"/api/v1/stats/breakdown?by={by}&from={date}&to={date}"
                                 f"&filters={raw}", at=later)
        got = [(r["value"], r["visitors"], r["pageviews"], r["events"]) for r in data["rows"]]
        assert got == reference_breakdown(by, FILTERS[raw], days={day}), date


def test_a_site_stores_a_bounded_number_of_segments(site_traffic, monkeypatch):
    monkeypatch.setattr(segments, "MAX_STORED_SEGMENTS", 1)
    later = FIRST_DAY + 9 * DAY
    google = site_traffic.data(f"/api/v1/stats/aggregate?{RANGE}&filters=source==Google", at=later)
    mobile = site_traffic.data(f"/api/v1/stats/aggregate?{RANGE}&filters=device==mobile", at=later)
    assert traffic_counts(google) == reference_range(range(3), FILTERS["source==Google"])
    assert traffic_counts(mobile) == reference_range(range(3), [("device", _is({"mobile"}))])
    segments_stored = site_traffic.db.execute(
        "SELECT DISTINCT segment FROM traffic_segment_days").fetchall()
    assert segments_stored == [("source==Google",)]


@pytest.mark.parametrize(("query", "message"), [
    ("filters=foo==1", "filters: unknown dimension 'foo' in 'foo==1'; use one of channel, "
                       "source, medium, campaign, entry_page, page, hostname, country, device, "
                       "browser, os, event or prop:KEY"),
    ("filters=source", "filters: 'source' has no operator; write DIMENSION==VALUE, != or ~"),
    ("filters=source==", "filters: 'source==' has an empty value"),
    ("filters=source==a||b", "filters: 'source==a||b' has an empty value"),
    ("filters=source==a;", "filters: empty filter; separate filters with one ;"),
    ("filters=prop:==x", "filters: 'prop:==x' needs a property key of 1 to 100 characters "
                         "after prop:"),
    ("filters=a==1&filters=b==2", "filters: give it at most once; join filters with ;"),
    ("goal=page:pricing", "goal: page:pricing must name a path starting with /"),
    ("goal=pageview", "goal: must be a custom event name (1 to 64 characters) or page:/PATH"),
    ("compare=last_week", "compare: must be one of previous_period, previous_year"),
    ("interval=minute", "interval: must be one of hour, day, week, month"),
    ("interval=hour&from=2026-01-01&to=2026-03-01",
     "interval: hour covers at most 31 days; this range has 60"),
])
def test_a_bad_parameter_is_400_with_its_problem(site_traffic, query, message):
    body = site_traffic.get(f"/api/v1/stats/timeseries?{query}", status=400)
    assert body == {"ok": False, "error": {"code": "invalid_input", "message": message}}


@pytest.mark.parametrize("raw", ["page==/pricing|/docs", "page!=/blog", "page~DOC"])
def test_a_filter_on_the_breakdowns_own_dimension_reads_the_stored_rows(site_traffic, raw):
    later = FIRST_DAY + 9 * DAY
    filtered = site_traffic.data(f"/api/v1/stats/breakdown?by=page&{RANGE}&filters={raw}",
                                 at=later)
    predicate = FILTERS.get(raw) or [("page", _not({"/blog"}) if "!=" in raw
                                      else _is({"/pricing", "/docs"}) if "==" in raw
                                      else _contains(["DOC"]))]
    got = [(r["value"], r["visitors"], r["pageviews"], r["events"]) for r in filtered["rows"]]
    assert got == reference_breakdown("page", predicate)
    assert site_traffic.db.execute("SELECT count(*) FROM traffic_segment_dimensions").fetchone() == (0,)
    stored = site_traffic.db.execute("SELECT DISTINCT dimension FROM traffic_day_dimensions")
    assert stored.fetchall() == [("page",)]


def test_a_session_filter_gives_its_breakdown_rows_figures(site_traffic):
    rows = site_traffic.data(f"/api/v1/stats/breakdown?by=channel&{RANGE}")["rows"]
    assert len(rows) == 3
    for row in rows:
        data = site_traffic.data(f"/api/v1/stats/aggregate?{RANGE}&filters=channel=={row['value']}")
        assert traffic_counts(data) | {"sessions": 0} == {
            "visitors": row["visitors"], "pageviews": row["pageviews"], "events": row["events"],
            "sessions": 0}


def test_hours_of_final_days_are_stored_and_read_back(site_traffic):
    later = FIRST_DAY + 9 * DAY
    path = f"/api/v1/stats/timeseries?{RANGE}&interval=hour&filters=source==Google"
    first = site_traffic.data(path, at=later)
    assert len(first["rows"]) == 72
    daily = site_traffic.data(f"/api/v1/stats/timeseries?{RANGE}&filters=source==Google",
                              at=later)["rows"]
    for day in range(3):
        hours = first["rows"][day * 24:(day + 1) * 24]
        for figure in ("pageviews", "events", "sessions", "visitors"):
            assert sum(h[figure] for h in hours) == daily[day][figure]
    stored = site_traffic.db.execute(
        "SELECT count(*) FROM traffic_segment_days WHERE segment = ?",
        ("source==Google\x1fhour",)).fetchone()
    assert stored == (72,)
    delete_unchecked(site_traffic.url, "events", "sessions")
    assert site_traffic.data(path, at=later) == first
