"""Revenue by any first-touch dimension, with traffic per row, filters and comparison.

Four visitors arrive today (2026-09-21, the fake clock's day): A from Google (GB,
desktop), B from a newsletter campaign (US, iPhone), D typing the address and E from
Google (both GB, desktop, never customers). A and B identify themselves; customer C has
no link, so no first touch. Figures below are worked out by hand from these inputs.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from tests.test_reports_http import FIREFOX, IPHONE, api  # noqa: F401 - the fixture

D = Decimal
A = {"ip": "81.2.69.142", "ua": FIREFOX}
B = {"ip": "8.8.8.8", "ua": IPHONE}
V_D = {"ip": "81.2.69.160", "ua": FIREFOX}
V_E = {"ip": "81.2.69.161", "ua": FIREFOX}
CUS_A = {"id": "cus_a", "user_id": "user-a"}
CUS_B = {"id": "cus_b", "user_id": "user-b"}
CUS_C = {"id": "cus_c"}


@pytest.fixture
def shop(api):  # noqa: F811 - the fixture of tests.test_reports_http
    api.events(
        api.event(A, "pageview", "/", 3000, r="https://www.google.com/"),
        api.event(B, "pageview", "/pricing?utm_source=newsletter&utm_medium=email"
                                 "&utm_campaign=fall", 2970),
        api.event(V_D, "pageview", "/docs", 2900),
        api.event(V_E, "pageview", "/", 2800, r="https://www.google.com/"),
        api.event(A, "$identify", "/account", 2950, uid="user-a"),
        api.event(B, "$identify", "/account", 2940, uid="user-b"),
        api.event(B, "signup", "/account", 2930),
    )
    api.pay("p1", CUS_A, 100, subscription={"id": "s1", "plan": "Pro", "interval": "month",
                                            "amount": 100}, paid_at="2026-09-20T12:00:00Z")
    api.pay("p2", CUS_A, 20, kind="refund", paid_at="2026-09-21T10:00:00Z")
    api.pay("p3", CUS_B, 50, paid_at="2026-09-10T12:00:00Z")
    api.pay("p4", CUS_C, 25, paid_at="2026-09-11T12:00:00Z")
    api.pay("p5", CUS_B, 10, currency="USD", paid_at="2026-09-12T12:00:00Z")
    api.pay("p6", CUS_A, 70, paid_at="2026-08-10T12:00:00Z")  # the previous period
    return api


def row(value, net, visitors=None, paying=None, rate=None, per_visitor=None):
    return {"value": value, "net": D(net), "visitors": visitors, "paying_customers": paying,
            "conversion_rate": None if rate is None else D(rate),
            "net_per_visitor": None if per_visitor is None else D(per_visitor)}


def rows_of(data, currency):
    keys = ("value", "net", "visitors", "paying_customers", "conversion_rate", "net_per_visitor")
    return [{k: r[k] for k in keys} for r in data["currencies"][currency]["rows"]]


@pytest.mark.parametrize(("by", "eur", "usd"), [
    # Google: net 100 - 20; visitors A and E; A paid. Newsletter: B, who paid in both.
    ("source", [row("Google", "80.00", 2, 1, "0.5", "40.00"),
                row("newsletter", "50.00", 1, 1, "1.0", "50.00"),
                row("Unattributed", "25.00")],
     [row("newsletter", "10.00", 1, 1, "1.0", "10.00")]),
    ("channel", [row("Organic Search", "80.00", 2, 1, "0.5", "40.00"),
                 row("Email", "50.00", 1, 1, "1.0", "50.00"),
                 row("Unattributed", "25.00")],
     [row("Email", "10.00", 1, 1, "1.0", "10.00")]),
    # A, D and E have no campaign (the null row), B's is "fall".
    ("campaign", [row(None, "80.00", 3, 1, "0.3333", "26.67"),
                  row("fall", "50.00", 1, 1, "1.0", "50.00"),
                  row("Unattributed", "25.00")],
     [row("fall", "10.00", 1, 1, "1.0", "10.00")]),
    ("medium", [row(None, "80.00", 3, 1, "0.3333", "26.67"),
                row("email", "50.00", 1, 1, "1.0", "50.00"),
                row("Unattributed", "25.00")],
     [row("email", "10.00", 1, 1, "1.0", "10.00")]),
    ("landing_page", [row("https://example.com/", "80.00", 2, 1, "0.5", "40.00"),
                      row("https://example.com/pricing?utm_source=newsletter&utm_medium=email"
                          "&utm_campaign=fall", "50.00", 1, 1, "1.0", "50.00"),
                      row("Unattributed", "25.00")], None),
    ("country", [row("GB", "80.00", 3, 1, "0.3333", "26.67"),
                 row("US", "50.00", 1, 1, "1.0", "50.00"),
                 row("Unattributed", "25.00")], None),
    ("device", [row("desktop", "80.00", 3, 1, "0.3333", "26.67"),
                row("mobile", "50.00", 1, 1, "1.0", "50.00"),
                row("Unattributed", "25.00")], None),
    # The plan is the customer's subscription's, not a first touch: no traffic figures.
    ("plan", [row("Pro", "80.00"), row(None, "75.00")], [row(None, "10.00")]),
])
def test_revenue_by_a_first_touch_dimension(shop, by, eur, usd):
    data = shop.data(f"/api/v1/stats/revenue?by={by}")
    assert data["by"] == by
    assert rows_of(data, "EUR") == eur
    if usd is not None:
        assert rows_of(data, "USD") == usd
    # The currency totals and by_channel stay those of the revenue report.
    assert data["currencies"]["EUR"]["net"] == D("155.00")
    assert [r["channel"] for r in data["currencies"]["EUR"]["by_channel"]] == [
        "Organic Search", "Email", "Unattributed"]


def test_rows_add_up_to_the_currency_totals(shop):
    for by in ("source", "referrer", "term", "content", "browser", "os", "plan"):
        for figures in shop.data(f"/api/v1/stats/revenue?by={by}")["currencies"].values():
            for figure in ("gross", "refunds", "net", "payments"):
                assert sum(r[figure] for r in figures["rows"]) == figures[figure], (by, figure)


def test_filters_select_customers_by_first_touch(shop):
    google = shop.data("/api/v1/stats/revenue?by=source&filters=source==Google")
    assert list(google["currencies"]) == ["EUR"]
    assert google["currencies"]["EUR"]["net"] == D("80.00")
    assert rows_of(google, "EUR") == [row("Google", "80.00", 2, 1, "0.5", "40.00")]
    # C has no first touch: it "does not equal" Organic Search.
    others = shop.data("/api/v1/stats/revenue?filters=channel!=Organic%20Search")
    assert others["currencies"]["EUR"]["net"] == D("75.00")
    assert [r["channel"] for r in others["currencies"]["EUR"]["by_channel"]] == [
        "Email", "Unattributed"]
    # Event dimensions read the first-touch session's first event.
    pricing = shop.data("/api/v1/stats/revenue?filters=page==/pricing;device==mobile")
    assert {c: f["net"] for c, f in pricing["currencies"].items()} == {
        "EUR": D("50.00"), "USD": D("10.00")}


def test_compare_revenue_with_the_previous_period(shop):
    data = shop.data("/api/v1/stats/revenue?compare=previous_period")
    assert (data["compare"]["from"], data["compare"]["to"]) == ("2026-07-24", "2026-08-22")
    assert data["compare"]["currencies"]["EUR"]["net"] == D("70.00")
    # (155 - 70) / 70
    assert data["change"]["currencies"]["EUR"]["net"] == D("1.2143")
    assert data["change"]["currencies"]["USD"]["net"] is None


def test_timeseries_revenue_per_day_with_filters(shop):
    data = shop.data("/api/v1/stats/timeseries?from=2026-09-19&to=2026-09-21")
    revenue = {r["start"]: r["revenue"] for r in data["rows"]}
    assert revenue["2026-09-19"]["EUR"] == {"net": D("0.00"), "new_customers": 0,
                                            "mrr": D("0.00")}
    assert revenue["2026-09-20"]["EUR"] == {"net": D("100.00"), "new_customers": 0,
                                            "mrr": D("100.00")}
    assert revenue["2026-09-21"]["EUR"] == {"net": D("-20.00"), "new_customers": 0,
                                            "mrr": D("100.00")}
    first_days = shop.data("/api/v1/stats/timeseries?from=2026-09-10&to=2026-09-12")
    assert [r["revenue"]["EUR"]["new_customers"] for r in first_days["rows"]] == [1, 1, 0]
    assert [r["revenue"]["USD"]["new_customers"] for r in first_days["rows"]] == [0, 0, 1]
    filtered = shop.data("/api/v1/stats/timeseries?from=2026-09-10&to=2026-09-12"
                         "&filters=source==newsletter")
    assert [r["revenue"]["EUR"]["new_customers"] for r in filtered["rows"]] == [1, 0, 0]
    assert [r["revenue"]["EUR"]["net"] for r in filtered["rows"]] == [D("50.00"), D("0.00"),
                                                                      D("0.00")]


def test_a_bad_dimension_is_400(shop):
    body = shop.get("/api/v1/stats/revenue?by=planet", status=400).json
    assert body["error"]["message"] == (
        "by: must be one of channel, source, medium, campaign, term, content, referrer, "
        "landing_page, country, device, browser, os, plan")


def test_filters_on_mrr_and_movements_select_customers_by_first_touch(shop):
    assert shop.data("/api/v1/stats/mrr")["currencies"]["EUR"]["mrr"] == D("100.00")
    google = shop.data("/api/v1/stats/mrr?filters=source==Google")
    assert google["filters"] == "source==Google"
    assert google["currencies"]["EUR"]["by_channel"] == [
        {"channel": "Organic Search", "mrr": D("100.00"), "subscriptions": 1, "customers": 1}]
    assert shop.data("/api/v1/stats/mrr?filters=source==newsletter")["currencies"] == {}
    moves = shop.data("/api/v1/stats/mrr/movements?from=2026-09-01&to=2026-09-21"
                      "&filters=device==desktop")["currencies"]["EUR"]["months"]
    assert [(m["new"], m["end_mrr"]) for m in moves] == [(D("100.00"), D("100.00"))]
    assert shop.data("/api/v1/stats/mrr/movements?from=2026-09-01&to=2026-09-21"
                     "&filters=device==mobile")["currencies"] == {}
