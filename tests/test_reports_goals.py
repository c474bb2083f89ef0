"""Goals and realtime over HTTP, against figures worked out by hand from the events sent
(the visitors and payments of tests.test_reports_revenue_by; clock 2026-09-21T14:13:20Z)."""

from __future__ import annotations

from decimal import Decimal

from tests.test_reports_http import api  # noqa: F401 - the fixture
from tests.test_reports_revenue_by import V_D, V_E, A, B, shop  # noqa: F401 - the fixture

D = Decimal


def test_goals_with_conversions_and_the_revenue_of_converted_customers(shop):  # noqa: F811
    shop.events(shop.event(A, "download", "/docs", 2000), shop.event(A, "download", "/docs", 1990))
    data = shop.data("/api/v1/stats/goals")
    # Four visitors today (A, B, D, E). B signed up and paid 50 EUR and 10 USD in the range;
    # A downloaded twice and paid 100 EUR, refunded 20.
    assert data["visitors"] == 4
    assert data["goals"] == [
        {"name": "download", "conversions": 1, "events": 2, "conversion_rate": D("0.25"),
         "revenue": {"EUR": {"net": D("80.00"), "customers": 1}}},
        {"name": "signup", "conversions": 1, "events": 1, "conversion_rate": D("0.25"),
         "revenue": {"EUR": {"net": D("50.00"), "customers": 1},
                     "USD": {"net": D("10.00"), "customers": 1}}},
    ]
    # Filters narrow the traffic and the customers by first touch alike.
    google = shop.data("/api/v1/stats/goals?filters=source==Google")
    assert google["visitors"] == 2
    assert google["goals"] == [
        {"name": "download", "conversions": 1, "events": 2, "conversion_rate": D("0.5"),
         "revenue": {"EUR": {"net": D("80.00"), "customers": 1}}}]
    assert shop.data("/api/v1/stats/goals?limit=1")["goals"][0]["name"] == "download"
    assert shop.data("/api/v1/stats/goals?from=2026-09-01&to=2026-09-20")["goals"] == []


def test_realtime_counts_the_last_minutes(shop):  # noqa: F811
    shop.events(
        shop.event(A, "pageview", "/pricing", 100),  # a new visit (A was last seen 49 min ago)
        shop.event(V_D, "pageview", "/docs", 400),   # a new visit, outside the 5 minutes
        shop.event(V_E, "pageview", "/", 1100),      # E's Google visit goes on
        shop.event(B, "pageview", "/late", 1900),    # before the 30 minutes
    )
    data = shop.data("/api/v1/stats/realtime")
    assert data["at"] == "2026-09-21T14:13:20Z"
    assert data["visitors"] == 1
    minutes = data["pageviews_per_minute"]
    assert len(minutes) == 30
    assert (minutes[0]["minute"], minutes[-1]["minute"]) == ("2026-09-21T13:44:00Z",
                                                             "2026-09-21T14:13:00Z")
    assert {m["minute"]: m["pageviews"] for m in minutes if m["pageviews"]} == {
        "2026-09-21T13:55:00Z": 1, "2026-09-21T14:06:00Z": 1, "2026-09-21T14:11:00Z": 1}
    assert data["top_pages"] == [{"page": "/", "visitors": 1, "pageviews": 1},
                                 {"page": "/docs", "visitors": 1, "pageviews": 1},
                                 {"page": "/pricing", "visitors": 1, "pageviews": 1}]
    assert data["top_sources"] == [{"source": None, "visitors": 2},
                                   {"source": "Google", "visitors": 1}]
    assert data["max_delay_seconds"] == D("1.0")
    assert shop.get("/api/v1/stats/realtime?from=2026-09-01", status=400).json["error"][
        "message"] == "unknown parameter 'from'; this report takes no parameters"
