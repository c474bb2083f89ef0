"""The report endpoints over HTTP, with figures computed by hand from the data sent.

Events and payments go in through the real endpoints (queue, flush, attribution,
SQLite file); the clock is the only fake. It stands at 2026-09-21T14:13:20Z, so the
default range is 2026-08-23 to 2026-09-21.
"""

from __future__ import annotations

import json
from decimal import Decimal

import jsonschema
import orjson
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from api.openapi import load_document
from tests.conftest import WAIT, bearer, run_cli

FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
IPHONE = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, "
          "like Gecko) Version/17.0 Mobile/15E148 Safari/604.1")
# Visitors: A from Google, B from a newsletter, C typing the address; A and C in GB, B in US.
A = {"ip": "81.2.69.142", "ua": FIREFOX}
B = {"ip": "8.8.8.8", "ua": IPHONE}
C = {"ip": "81.2.69.160", "ua": FIREFOX}


@pytest.fixture
def api(client, tally, site, clock):
    headers = bearer(site["key"])
    site_id = site["site"]["id"]

    class Api:
        def __init__(self):
            self.site_id = site_id
            self.now_ms = int(clock() * 1000)

        def events(self, *events):
            client.post_json("/api/v1/events", {"s": site_id, "b": list(events)}, headers=headers,
                             status=204)
            assert tally.flusher.flush_now(timeout=WAIT)

        def event(self, visitor, name, path, seconds_ago, **extra):
            return {"s": site_id, "e": name, "u": f"https://example.com{path}",
                    "ts": self.now_ms - seconds_ago * 1000, **visitor, **extra}

        def pay(self, payment_id, customer, amount, currency="EUR", kind="charge",
                paid_at="2026-09-01T12:00:00Z", **extra):
            body = {"payment_id": payment_id, "customer": customer, "amount": amount,
                    "currency": currency, "kind": kind, "paid_at": paid_at, **extra}
            client.post_json("/api/v1/payments", body, headers=headers, status=200)

        def get(self, path, status=200, key=None):
            resp = client.get(path, headers=bearer(key or site["key"]), expect_errors=True)
            assert resp.status_int == status, resp.body
            return resp

        def data(self, path):
            # parse_float=Decimal keeps the digits of each JSON number as sent.
            return json.loads(self.get(path).body, parse_float=Decimal)["data"]

    tally.start()
    return Api()


@pytest.fixture
def linked(api):
    """A's first touch is Google (Organic Search), B's a newsletter (Email); both identified."""
    api.events(
        api.event(A, "pageview", "/", 3000, r="https://www.google.com/"),
        api.event(B, "pageview", "/pricing?utm_source=newsletter&utm_medium=email", 2970),
        api.event(A, "$identify", "/account", 2950, uid="user-a"),
        api.event(B, "$identify", "/account", 2940, uid="user-b"),
    )
    return api


CUS_A = {"id": "cus_a", "user_id": "user-a"}
CUS_B = {"id": "cus_b", "user_id": "user-b"}
CUS_C = {"id": "cus_c"}  # no link: Unattributed
D = Decimal


def figures(gross, refunds, chargebacks, fees, net, net_after_fees, payments, customers):
    return {"gross": D(gross), "refunds": D(refunds), "chargebacks": D(chargebacks),
            "fees": D(fees), "net": D(net), "net_after_fees": D(net_after_fees),
            "payments": payments, "customers": customers}


def test_revenue_per_currency_and_first_touch_channel(linked):
    api = linked
    api.pay("p1", CUS_A, 100.00, fee=3.20)
    api.pay("p2", CUS_A, 20.00, kind="refund", paid_at="2026-09-05T12:00:00Z")
    api.pay("p3", CUS_B, 49.99, fee=1.75, paid_at="2026-09-02T12:00:00Z")
    api.pay("p4", CUS_B, 49.99, kind="chargeback", fee=15, paid_at="2026-09-10T12:00:00Z")
    api.pay("p5", CUS_C, 25, fee=1, paid_at="2026-09-03T12:00:00Z")
    api.pay("p6", CUS_A, 50, status="failed", paid_at="2026-09-04T12:00:00Z")
    api.pay("p7", CUS_C, 30, status="pending")
    api.pay("p8", CUS_A, 70, paid_at="2026-08-10T12:00:00Z")  # before the default range
    api.pay("p9", CUS_C, 11, paid_at="2026-09-22T00:00:00Z")  # after it
    api.pay("p10", CUS_B, 19.99, currency="USD", fee=0.88, paid_at="2026-09-15T12:00:00Z")
    api.pay("p11", CUS_A, 5, currency="USD", paid_at="2026-09-21T23:59:59.999Z")
    api.pay("p12", CUS_C, 1200, currency="JPY", fee=36, paid_at="2026-08-23T00:00:00Z")

    data = api.data("/api/v1/stats/revenue")
    assert (data["from"], data["to"]) == ("2026-08-23", "2026-09-21")
    assert list(data["currencies"]) == ["EUR", "JPY", "USD"]
    eur = data["currencies"]["EUR"]
    # gross 100 + 49.99 + 25; net 174.99 - 20 - 49.99; fees 3.20 + 1.75 + 15 + 1.
    assert {k: v for k, v in eur.items() if k not in ("by_channel", "rows")} == figures(
        "174.99", "20.00", "49.99", "20.95", "105.00", "84.05", 5, 3)
    assert eur["by_channel"] == [
        {"channel": "Organic Search", **figures("100", "20", "0", "3.20", "80", "76.80", 2, 1)},
        {"channel": "Unattributed", **figures("25", "0", "0", "1", "25", "24", 1, 1)},
        {"channel": "Email", **figures("49.99", "0", "49.99", "16.75", "0", "-16.75", 2, 1)},
    ]
    usd = data["currencies"]["USD"]
    assert {k: v for k, v in usd.items() if k not in ("by_channel", "rows")} == figures(
        "24.99", "0", "0", "0.88", "24.99", "24.11", 2, 2)
    assert [(r["channel"], r["net"]) for r in usd["by_channel"]] == [
        ("Email", D("19.99")), ("Organic Search", D("5"))]
    assert data["currencies"]["JPY"]["net_after_fees"] == D("1164")

    body = api.get("/api/v1/stats/revenue").body
    assert b'"fees":20.95,"net":105.00,"net_after_fees":84.05,"payments":5' in body
    assert b'"JPY":{"gross":1200,"refunds":0,' in body

    august = api.data("/api/v1/stats/revenue?from=2026-08-01&to=2026-08-31")["currencies"]
    assert list(august) == ["EUR", "JPY"]
    assert august["EUR"]["by_channel"] == [
        {"channel": "Organic Search", **figures("70", "0", "0", "0", "70", "70", 1, 1)}]


def test_revenue_follows_links_known_now(api):
    api.pay("p1", {"id": "cus_late", "user_id": "user-late"}, 10)
    before = api.data("/api/v1/stats/revenue")["currencies"]["EUR"]["by_channel"]
    assert [r["channel"] for r in before] == ["Unattributed"]
    api.events(api.event(A, "pageview", "/", 600, r="https://www.google.com/"),
               api.event(A, "$identify", "/account", 590, uid="user-late"))
    after = api.data("/api/v1/stats/revenue")["currencies"]["EUR"]["by_channel"]
    assert [(r["channel"], r["net"]) for r in after] == [("Organic Search", D("10"))]


def subscribe(api, payment_id, customer, amount, sub, paid_at, currency="EUR", **payment):
    api.pay(payment_id, customer, amount, currency=currency, paid_at=paid_at,
            subscription=sub, **payment)


@pytest.fixture
def subscriptions(linked):
    api = linked
    # EUR: A monthly 30, past_due from 15 August (still counted), canceled on the 25th, back
    # on a new subscription on 20 September; B yearly 120, upgraded to 240 on 5 September.
    subscribe(api, "e1", CUS_A, 30, {"id": "s1", "plan": "Pro", "interval": "month",
                                     "amount": 30}, "2026-07-01T12:00:00Z")
    subscribe(api, "e2", CUS_B, 120, {"id": "s2", "plan": "Pro", "interval": "year",
                                      "amount": 120}, "2026-07-02T12:00:00Z")
    subscribe(api, "e3", CUS_A, 30, {"id": "s1", "plan": "Pro", "interval": "month",
                                     "amount": 30, "status": "past_due"},
              "2026-08-15T12:00:00Z", status="failed")
    subscribe(api, "e4", CUS_B, 240, {"id": "s2", "plan": "Pro", "interval": "year",
                                      "amount": 240}, "2026-09-05T12:00:00Z")
    subscribe(api, "e5", CUS_A, 30, {"id": "s1", "plan": "Pro", "interval": "month",
                                     "amount": 30, "status": "canceled",
                                     "ended_at": "2026-08-25T00:00:00Z"},
              "2026-08-25T12:00:00Z", kind="refund")
    subscribe(api, "e6", CUS_A, 25, {"id": "s8", "plan": "Pro", "interval": "month",
                                     "amount": 25}, "2026-09-20T12:00:00Z")
    # USD: C weekly 10 (cut to 5 on 12 September) and daily 1; D 15 with no interval, and
    # a monthly plan without an amount (its charge of 12 counts); E only on trial.
    cus_d, cus_e = {"id": "cus_d"}, {"id": "cus_e"}
    subscribe(api, "u1", CUS_C, 10, {"id": "s3", "plan": "Team", "interval": "week",
                                     "amount": 10}, "2026-07-03T12:00:00Z", currency="USD")
    subscribe(api, "u2", CUS_C, 1, {"id": "s4", "plan": "Team", "interval": "day",
                                    "amount": 1}, "2026-07-03T13:00:00Z", currency="USD")
    subscribe(api, "u3", cus_d, 15, {"id": "s5", "amount": 15}, "2026-07-04T12:00:00Z",
              currency="USD")
    subscribe(api, "u4", cus_d, 12, {"id": "s6", "plan": "Basic", "interval": "month"},
              "2026-07-05T12:00:00Z", currency="USD")
    subscribe(api, "u5", CUS_C, 5, {"id": "s3", "plan": "Team", "interval": "week",
                                    "amount": 5}, "2026-09-12T12:00:00Z", currency="USD")
    subscribe(api, "u6", cus_e, 99, {"id": "s7", "plan": "Pro", "status": "trialing",
                                     "amount": 99}, "2026-07-06T12:00:00Z", currency="USD")
    return api


def row(name, key, mrr, subscriptions, customers):
    return {key: name, "mrr": D(mrr), "subscriptions": subscriptions, "customers": customers}


def test_mrr_today(subscriptions):
    data = subscriptions.data("/api/v1/stats/mrr")
    assert data["at"] == "2026-09-21"
    eur, usd = data["currencies"]["EUR"], data["currencies"]["USD"]
    assert (eur["mrr"], eur["arr"], eur["subscriptions"], eur["customers"]) == (
        D("45.00"), D("540.00"), 2, 2)
    assert eur["by_channel"] == [row("Organic Search", "channel", "25", 1, 1),
                                 row("Email", "channel", "20", 1, 1)]
    assert eur["by_plan"] == [row("Pro", "plan", "45", 2, 2)]
    # 5 x 52/12 + 1 x 365/12 + 15 + 12 = 21.666... + 30.4166... + 27 = 79.0833...
    assert (usd["mrr"], usd["arr"], usd["subscriptions"], usd["customers"]) == (
        D("79.08"), D("949.00"), 4, 2)
    assert usd["by_channel"] == [row("Unattributed", "channel", "79.08", 4, 2)]
    assert usd["by_plan"] == [row("Team", "plan", "52.08", 2, 1), row(None, "plan", "15", 1, 1),
                              row("Basic", "plan", "12", 1, 1)]


def test_mrr_at_an_earlier_date_uses_the_state_known_then(subscriptions):
    data = subscriptions.data("/api/v1/stats/mrr?at=2026-08-20")
    eur, usd = data["currencies"]["EUR"], data["currencies"]["USD"]
    # A past_due still counts: 30 + 120/12.
    assert (eur["mrr"], eur["arr"], eur["subscriptions"]) == (D("40.00"), D("480.00"), 2)
    assert eur["by_channel"] == [row("Organic Search", "channel", "30", 1, 1),
                                 row("Email", "channel", "10", 1, 1)]
    # 10 x 52/12 + 30.4166... + 15 + 12 = 100.75
    assert (usd["mrr"], usd["arr"]) == (D("100.75"), D("1209.00"))
    after_cancel = subscriptions.data("/api/v1/stats/mrr?at=2026-08-31")["currencies"]["EUR"]
    assert (after_cancel["mrr"], after_cancel["subscriptions"]) == (D("10.00"), 1)
    assert subscriptions.data("/api/v1/stats/mrr?at=2026-06-30")["currencies"] == {}


def test_mrr_movements_of_every_type(subscriptions):
    data = subscriptions.data("/api/v1/stats/mrr/movements?from=2026-07-01&to=2026-09-30")
    zero = dict.fromkeys(("new", "expansion", "contraction", "churn", "reactivation"), D(0))

    def month(name, first, last, start, end, **moves):
        return {"month": name, "from": first, "to": last, "start_mrr": D(start),
                "end_mrr": D(end), **zero, **{k: D(v) for k, v in moves.items()}}

    assert data["currencies"]["EUR"]["months"] == [
        month("2026-07", "2026-07-01", "2026-07-31", "0", "40", new="40"),
        month("2026-08", "2026-08-01", "2026-08-31", "40", "10", churn="-30"),
        month("2026-09", "2026-09-01", "2026-09-30", "10", "45",
              expansion="10", reactivation="25"),
    ]
    assert data["currencies"]["USD"]["months"] == [
        month("2026-07", "2026-07-01", "2026-07-31", "0", "100.75", new="100.75"),
        month("2026-08", "2026-08-01", "2026-08-31", "100.75", "100.75"),
        # 10 -> 5 a week is 43.333... -> 21.666... a month.
        month("2026-09", "2026-09-01", "2026-09-30", "100.75", "79.08", contraction="-21.67"),
    ]


def test_traffic_aggregate_and_breakdowns(api):
    api.events(
        # A: two pages and a signup in two minutes, from Google.
        api.event(A, "pageview", "/", 3000, r="https://www.google.com/"),
        api.event(A, "pageview", "/pricing", 2940),
        api.event(A, "signup", "/pricing", 2880),
        # B: one page from a newsletter, then identified (not counted as an event).
        api.event(B, "pageview", "/pricing?utm_source=newsletter&utm_medium=email", 2970),
        api.event(B, "$identify", "/account", 2960, uid="user-b"),
        # C: two visits 40 minutes apart, one page each.
        api.event(C, "pageview", "/", 3000),
        api.event(C, "pageview", "/docs", 600),
        # No ip/ua: a pageview without a visitor or a session.
        {"s": api.site_id, "e": "pageview", "u": "https://example.com/docs",
         "ts": api.now_ms - 500_000},
    )
    data = api.data("/api/v1/stats/aggregate")
    assert data == {"from": "2026-08-23", "to": "2026-09-21", "visitors": 3, "pageviews": 6,
                    "sessions": 4, "events": 1, "bounce_rate": D("0.75"),
                    "avg_session_seconds": D("30.0")}
    assert api.data("/api/v1/stats/aggregate?from=2026-09-01&to=2026-09-20")["pageviews"] == 0

    def rows(by, limit=""):
        data = api.data(f"/api/v1/stats/breakdown?by={by}{limit}")
        assert data["by"] == by
        return [(r["value"], r["visitors"], r["pageviews"], r["events"]) for r in data["rows"]]

    assert rows("page") == [("/", 2, 2, 0), ("/pricing", 2, 2, 1), ("/docs", 1, 2, 0)]
    assert rows("page", "&limit=1") == [("/", 2, 2, 0)]
    assert rows("entry_page") == [("/", 2, 3, 1), ("/docs", 1, 1, 0), ("/pricing", 1, 1, 0)]
    assert rows("channel") == [("Direct", 1, 2, 0), ("Email", 1, 1, 0),
                               ("Organic Search", 1, 2, 1)]
    assert rows("source") == [("Google", 1, 2, 1), ("newsletter", 1, 1, 0), (None, 1, 2, 0)]
    assert rows("country") == [("GB", 2, 4, 1), ("US", 1, 1, 0), (None, 0, 1, 0)]
    assert rows("device") == [("desktop", 2, 4, 1), ("mobile", 1, 1, 0), (None, 0, 1, 0)]
    assert rows("browser") == [("Firefox", 2, 4, 1), ("Mobile Safari", 1, 1, 0),
                               (None, 0, 1, 0)]
    assert rows("os") == [("Linux", 2, 4, 1), ("iOS", 1, 1, 0), (None, 0, 1, 0)]
    assert rows("event") == [("signup", 1, 0, 1)]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("/api/v1/stats/revenue?from=2026-9-1", "from: must be a UTC date YYYY-MM-DD, not '2026-9-1'"),
        ("/api/v1/stats/revenue?from=2026-09-10&to=2026-09-01",
         "from: 2026-09-10 is after to 2026-09-01"),
        ("/api/v1/stats/aggregate?from=2025-01-01&to=2026-09-21",
         "from/to: the range covers more than 366 days"),
        ("/api/v1/stats/mrr?at=2026-02-30", "at: '2026-02-30' is not a calendar date"),
        ("/api/v1/stats/mrr?from=2026-01-01", "unknown parameter 'from'; this report takes at, filters"),
        ("/api/v1/stats/mrr/movements?to=tomorrow",
         "to: must be a UTC date YYYY-MM-DD, not 'tomorrow'"),
        ("/api/v1/stats/breakdown", "by: must be one of channel, source, page, entry_page, "
                                    "country, device, browser, os, event, medium, campaign,"
                                    " term, content"),
        ("/api/v1/stats/breakdown?by=page&limit=1001",
         "limit: must be a whole number from 1 to 1000"),
        ("/api/v1/stats/breakdown?by=page&by=os", "by: give it at most once"),
    ],
)
def test_bad_parameters_are_400_invalid_input(api, query, message):
    resp = api.get(query, status=400)
    assert orjson.loads(resp.body) == {"ok": False,
                                       "error": {"code": "invalid_input", "message": message}}


@pytest.mark.parametrize("path", ["/api/v1/stats/revenue", "/api/v1/stats/mrr",
                                  "/api/v1/stats/mrr/movements", "/api/v1/stats/aggregate",
                                  "/api/v1/stats/breakdown?by=page"])
def test_reports_need_the_read_scope(api, directory, site, path):
    writer = directory.create_key(site["site"]["id"], ["events", "payments"])["key"]
    assert orjson.loads(api.get(path, status=403, key=writer).body)["error"]["code"] == "forbidden"
    resp = api.get(path, status=401, key="tly_" + "A" * 43)
    assert orjson.loads(resp.body)["error"]["code"] == "unauthorized"


def cli(*args, db):
    proc = run_cli("report", *args, "--json", db=db)
    return json.loads(proc.stdout, parse_float=Decimal)


def test_tally_report_gives_the_endpoints_figures(subscriptions, db_path):
    api = subscriptions
    api.events(api.event(C, "pageview", "/docs", 100))
    site = ["--site", api.site_id]
    period = ["--from", "2026-07-01", "--to", "2026-09-30"]
    query = "from=2026-07-01&to=2026-09-30"
    assert cli("revenue", *site, *period, db=db_path) == api.data(f"/api/v1/stats/revenue?{query}")
    assert cli("mrr", *site, "--at", "2026-08-20", *period, db=db_path) == {
        "mrr": api.data("/api/v1/stats/mrr?at=2026-08-20"),
        "movements": api.data(f"/api/v1/stats/mrr/movements?{query}"),
    }
    assert cli("traffic", *site, *period, "--by", "page", "--limit", "5", db=db_path) == {
        "aggregate": api.data(f"/api/v1/stats/aggregate?{query}"),
        "breakdown": api.data(f"/api/v1/stats/breakdown?by=page&limit=5&{query}"),
    }
    revenue = run_cli("report", "revenue", *site, *period, db=db_path).stdout.splitlines()
    assert revenue[0] == "Revenue from 2026-07-01 to 2026-09-30 (succeeded payments, by paid_at)"
    header = revenue.index("EUR") + 1
    assert revenue[header].split() == ["CHANNEL", "GROSS", "REFUNDS", "CHARGEBACKS", "FEES",
                                       "NET", "NET_AFTER_FEES", "PAYMENTS", "CUSTOMERS"]
    # Columns line up: every value starts where its header does.
    total = next(line for line in revenue if line.startswith("Total"))
    assert total[revenue[header].index("NET "):].split()[0] == "385.00"
    mrr = run_cli("report", "mrr", *site, "--at", "2026-08-20", db=db_path).stdout
    assert "EUR: mrr 40.00, arr 480.00, 2 subscriptions, 2 customers" in mrr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["revenue", "--from", "2026-13-01"], "tally: from: '2026-13-01' is not a calendar date"),
        (["mrr", "--at", "soon"], "tally: at: must be a UTC date YYYY-MM-DD, not 'soon'"),
        (["traffic", "--limit", "0"], "tally: limit: must be a whole number from 1 to 1000"),
    ],
)
def test_tally_report_refuses_bad_parameters(site, db_path, args, message):
    proc = run_cli("report", *args, "--site", site["site"]["id"], db=db_path, check=False)
    assert (proc.returncode, proc.stderr.strip(), proc.stdout) == (1, message, "")


def test_tally_report_of_an_unknown_site(tally, db_path):
    proc = run_cli("report", "revenue", "--site", "site_nope", db=db_path, check=False)
    assert (proc.returncode, proc.stderr.strip()) == (1, "tally: no site site_nope")


CONTRACT = Registry().with_resource(
    "urn:tally", Resource.from_contents(load_document(), default_specification=DRAFT202012))


@pytest.mark.parametrize(("path", "schema"), [
    ("/api/v1/stats/revenue?from=2026-07-01&to=2026-09-30", "RevenueOk"),
    ("/api/v1/stats/mrr?at=2026-08-20", "MrrOk"),
    ("/api/v1/stats/mrr/movements?from=2026-07-01&to=2026-09-30", "MrrMovementsOk"),
    ("/api/v1/stats/aggregate", "AggregateOk"),
    ("/api/v1/stats/breakdown?by=source", "BreakdownOk"),
])
def test_answers_match_the_openapi_document(subscriptions, path, schema):
    validator = jsonschema.Draft202012Validator(
        {"$ref": f"urn:tally#/components/schemas/{schema}"}, registry=CONTRACT)
    validator.validate(orjson.loads(subscriptions.get(path).body))
