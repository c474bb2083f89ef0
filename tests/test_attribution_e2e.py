"""First-touch attribution end to end over HTTP: events, $identify, payments, reads.

The WSGI tests drive the real app (queue, flush thread, SQLite file) and wait for the
flush with flush_now(); the slow test does the same against a real gunicorn.
"""

from __future__ import annotations

import csv
import time
from collections import Counter
from datetime import UTC, datetime
from urllib.parse import urlencode

import orjson
import pytest

from attribution.build_sources import GOOGLE_LIST
from tests.conftest import WAIT, bearer, http, provision

UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
UA_PHONE = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
            "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1")


def pageview(site_id, url, referrer=None, ip="203.0.113.7", ua=UA, **extra):
    event = {"s": site_id, "e": "pageview", "u": url, "ip": ip, "ua": ua, **extra}
    if referrer:
        event["r"] = referrer
    return event


def identify(site_id, uid, ip="203.0.113.7", ua=UA):
    return {"s": site_id, "e": "$identify", "u": "https://example.com/account", "uid": uid,
            "ip": ip, "ua": ua}


def charge(payment_id, customer, kind="charge", amount=30):
    return {"payment_id": payment_id, "amount": amount, "currency": "EUR", "kind": kind,
            "paid_at": "2026-09-21T15:00:00Z", "customer": customer}


@pytest.fixture
def api(client, tally, site, clock):
    headers = bearer(site["key"])
    site_id = site["site"]["id"]

    class Api:
        def events(self, *events):
            body = events[0] if len(events) == 1 else {"s": site_id, "b": list(events)}
            client.post_json("/api/v1/events", body, headers=headers, status=204)
            clock.advance(60)

        def flush(self):
            assert tally.flusher.flush_now(timeout=WAIT)

        def pay(self, body):
            client.post_json("/api/v1/payments", body, headers=headers, status=200)

        def get(self, path):
            return orjson.loads(client.get(path, headers=headers).body)["data"]

    api = Api()
    api.site_id = site_id
    tally.start()
    return api


def test_pageviews_then_identify_then_payment_is_organic_search(api):
    s = api.site_id
    api.events(pageview(s, "https://example.com/?utm_content=hero", "https://www.google.com/"))
    api.events(pageview(s, "https://example.com/pricing", "https://example.com/"))
    api.events(identify(s, "user-42"))
    api.flush()
    api.pay(charge("pay_1", {"id": "cus_1", "user_id": "user-42"}))

    attribution = api.get("/api/v1/payments/pay_1")["attribution"]
    assert attribution == {
        "channel": "Organic Search", "source": "Google", "referrer": "https://www.google.com/",
        "landing_page": "https://example.com/?utm_content=hero",
        "utm": {"source": None, "medium": None, "campaign": None, "term": None,
                "content": "hero"},
        "first_seen": "2026-09-21T14:13:20.000Z",
    }
    customer = api.get("/api/v1/customers/cus_1")
    assert customer["attribution"] == attribution
    assert customer["totals"] == {"EUR": {"paid": 30, "refunded": 0, "net": 30, "payments": 1}}


def test_every_source_on_googles_list_pays_in_ga4s_channel(api):
    """As a user would: a visit with utm_source = each entry of Google's list of source
    categories and no medium, then a payment of the visitor; the revenue report counts
    each payment in the channel GA4 gives that source."""
    with open(GOOGLE_LIST, encoding="utf-8", newline="") as handle:
        entries = [(row["source"], row["source_category"]) for row in csv.DictReader(handle)]
    ga4 = {"SOURCE_CATEGORY_SEARCH": "Organic Search", "SOURCE_CATEGORY_SOCIAL": "Organic Social",
           "SOURCE_CATEGORY_SHOPPING": "Organic Shopping",
           "SOURCE_CATEGORY_VIDEO": "Organic Video"}
    s = api.site_id
    events = []
    for n, (source, _) in enumerate(entries):
        ip = f"198.18.{n // 250}.{n % 250 + 1}"
        url = "https://example.com/?" + urlencode({"utm_source": source})
        events += [pageview(s, url, ip=ip), identify(s, f"ga4-{n}", ip=ip)]
    for start in range(0, len(events), 20):  # 20 events stay within 8 KiB
        api.events(*events[start:start + 20])
    api.flush()
    for n in range(len(entries)):
        api.pay(charge(f"pay_ga4_{n}", {"id": f"cus_ga4_{n}", "user_id": f"ga4-{n}"}, amount=1))

    revenue = api.get("/api/v1/stats/revenue?from=2026-09-21&to=2026-09-21")
    by_channel = {row["channel"]: row["payments"] for row in revenue["currencies"]["EUR"]["by_channel"]}
    assert by_channel == dict(Counter(ga4[category] for _, category in entries))
    yahoo = next(n for n, (source, _) in enumerate(entries) if source == "yahoo")
    attribution = api.get(f"/api/v1/payments/pay_ga4_{yahoo}")["attribution"]
    assert (attribution["source"], attribution["channel"]) == ("Yahoo", "Organic Search")
    assert attribution["utm"]["source"] == "yahoo"


def test_a_late_identify_re_attributes_the_payment_and_its_refund(api):
    s = api.site_id
    api.events(pageview(s, "https://example.com/", "https://t.co/xyz", ip="198.51.100.9",
                        ua=UA_PHONE))
    api.flush()
    api.pay(charge("pay_2", {"id": "cus_2", "user_id": "user-late"}))
    api.pay(charge("ref_2", {"id": "cus_2"}, kind="refund", amount=5))
    assert api.get("/api/v1/payments/pay_2")["attribution"]["channel"] == "Unattributed"

    api.events(identify(s, "user-late", ip="198.51.100.9", ua=UA_PHONE))
    api.flush()
    for payment_id in ("pay_2", "ref_2"):
        attribution = api.get(f"/api/v1/payments/{payment_id}")["attribution"]
        assert (attribution["channel"], attribution["source"]) == ("Organic Social", "Twitter")


def test_a_customer_with_no_links_is_unattributed(api):
    s = api.site_id
    api.events(pageview(s, "https://example.com/", "https://www.google.com/"))
    api.events(identify(s, "someone-else"))
    api.flush()
    api.pay(charge("pay_3", {"id": "cus_3", "email": "no-links@example.com"}))
    data = api.get("/api/v1/customers/cus_3")
    assert data["attribution"]["channel"] == "Unattributed"
    assert data["attribution"]["first_seen"] is None


def test_identify_from_another_browser_does_not_link(api):
    s = api.site_id
    api.events(pageview(s, "https://example.com/", "https://www.bing.com/"))
    api.events(identify(s, "user-7", ua=UA_PHONE))  # same ip, another user agent
    api.flush()
    api.pay(charge("pay_4", {"id": "cus_4", "user_id": "user-7"}))
    # The phone's visitor, which user-7 is linked to, never had a session.
    assert api.get("/api/v1/payments/pay_4")["attribution"]["channel"] == "Unattributed"


def test_the_events_table_records_each_events_session(api, tally):
    s = api.site_id
    api.events(pageview(s, "https://example.com/a", "https://duckduckgo.com/"),
               pageview(s, "https://example.com/b"))
    api.events(identify(s, "user-9"))
    api.flush()
    rows = tally.db.conn().execute(
        "SELECT e.name, s.channel, s.source, s.pageviews FROM events e"
        " LEFT JOIN sessions s ON s.id = e.session_id ORDER BY e.id").fetchall()
    assert rows == [("pageview", "Organic Search", "DuckDuckGo", 2),
                    ("pageview", "Organic Search", "DuckDuckGo", 2),
                    ("$identify", None, None, None)]


def test_a_visit_open_at_midnight_keeps_its_first_touch(api, clock):
    # Visitor ids change with the daily salt at midnight UTC; the session must not.
    s = api.site_id
    clock.set(datetime(2026, 9, 21, 23, 50, tzinfo=UTC).timestamp())
    api.events(pageview(s, "https://example.com/", "https://www.google.com/"))
    api.flush()
    clock.set(datetime(2026, 9, 22, 0, 10, tzinfo=UTC).timestamp())
    api.events(pageview(s, "https://example.com/signup", "https://example.com/"))
    api.events(identify(s, "night-owl"))
    api.flush()
    api.pay(charge("pay_5", {"id": "cus_5", "user_id": "night-owl"}))
    attribution = api.get("/api/v1/payments/pay_5")["attribution"]
    assert (attribution["channel"], attribution["first_seen"]) == (
        "Organic Search", "2026-09-21T23:50:00.000Z")


@pytest.mark.slow
def test_end_to_end_against_gunicorn(server_factory, db_path, tmp_path):
    _, site, key = provision(db_path, name="E2E", host="example.com",
                             scopes=("events", "payments", "read"))
    key = key["key"]
    server = server_factory(db_path, workers=2, env={"TALLY_FLUSH_INTERVAL": "0.05"})
    headers = {**bearer(key), "Content-Type": "application/json"}

    def send(path, body, expected):
        status, _, data = http("POST", server.url + path, orjson.dumps(body), headers)
        assert status == expected, data

    def channel_of(payment_id):
        status, _, data = http("GET", f"{server.url}/api/v1/payments/{payment_id}",
                               headers=bearer(key))
        assert status == 200, data
        return orjson.loads(data)["data"]["attribution"]

    def eventually(payment_id, channel):
        deadline = time.monotonic() + WAIT
        while (found := channel_of(payment_id))["channel"] != channel:
            assert time.monotonic() < deadline, f"{payment_id}: still {found}"
            time.sleep(0.05)
        return found

    s = site["id"]
    send("/api/v1/events", pageview(s, "https://example.com/", "https://www.google.co.uk/"), 204)
    send("/api/v1/events", identify(s, "user-1"), 204)
    send("/api/v1/payments", charge("pay_1", {"id": "cus_1", "user_id": "user-1"}), 200)
    found = eventually("pay_1", "Organic Search")
    assert found["source"] == "Google"

    send("/api/v1/events", pageview(s, "https://example.com/", "https://chatgpt.com/",
                                    ip="192.0.2.44"), 204)
    send("/api/v1/payments", charge("pay_2", {"id": "cus_2", "user_id": "user-2"}), 200)
    assert channel_of("pay_2")["channel"] == "Unattributed"
    send("/api/v1/events", identify(s, "user-2", ip="192.0.2.44"), 204)
    assert eventually("pay_2", "AI Assistants")["source"] == "ChatGPT"

    send("/api/v1/payments", charge("pay_3", {"id": "cus_3"}), 200)
    assert channel_of("pay_3")["channel"] == "Unattributed"
