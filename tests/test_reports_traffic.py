"""Traffic aggregate figures and breakdown ordering."""

from __future__ import annotations

from reports.traffic.figures import BreakdownCount, SessionTotals, breakdown_rows, traffic_aggregate


def test_aggregate_ratios_are_exact_and_rounded_half_up():
    totals = SessionTotals(visitors=5, pageviews=12, sessions=7, events=4, bounces=3,
                           duration_ms=1_000_500)
    assert traffic_aggregate(totals) == {
        "visitors": 5, "pageviews": 12, "sessions": 7, "events": 4,
        "bounce_rate": 0.4286,  # 3/7 = 0.428571...
        "avg_session_seconds": 142.9,  # 1000.5 s / 7 = 142.928...
    }
    # 1/32 = 0.03125: half up gives 0.0313 where round() would give 0.0312.
    assert traffic_aggregate(SessionTotals(sessions=32, bounces=1))["bounce_rate"] == 0.0313


def test_aggregate_without_sessions_is_zero():
    assert traffic_aggregate(SessionTotals()) == {
        "visitors": 0, "pageviews": 0, "sessions": 0, "events": 0,
        "bounce_rate": 0.0, "avg_session_seconds": 0.0}


def test_breakdown_sorts_by_visitors_then_value_and_limits():
    counts = [
        BreakdownCount("/pricing", 3, 5, 0),
        BreakdownCount(None, 9, 9, 0),
        BreakdownCount("/about", 3, 3, 1),
        BreakdownCount("/", 10, 14, 2),
        BreakdownCount("/blog", 3, 4, 0),
        BreakdownCount(None, 3, 1, 0),
    ]
    rows = breakdown_rows(counts, limit=5)
    assert [(r["value"], r["visitors"]) for r in rows] == [
        ("/", 10), (None, 9), ("/about", 3), ("/blog", 3), ("/pricing", 3)]
    assert rows[0] == {"value": "/", "visitors": 10, "pageviews": 14, "events": 2}
    assert breakdown_rows(counts, limit=100)[-1]["value"] is None
