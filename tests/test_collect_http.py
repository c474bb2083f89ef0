"""POST /api/v1/collect, GET /js/tally.js and browser visitor ids, over WSGI."""

from __future__ import annotations

import gzip
import io

import orjson
import pytest
import webtest

from api.client_ip import client_ip
from app import create_app
from config import Config, ConfigError
from enrichment.browser_ids import browser_visitor_id
from enrichment.visitor import visitor_id
from quota.usage import seconds_until_next_month
from tests.conftest import WriteLock, bearer, config_for, rows
from tests.test_events_http import FIREFOX, flush
from tests.test_http_foundation import assert_envelope
from tests.test_quota import assert_quota_refusal, seed_usage
from tracker import script_bytes
from validation.event import pack_ip

BROWSER = "0123456789abcdef0123456789abcdef"
OTHER_BROWSER = "fedcba9876543210fedcba9876543210"
CLIENT = "203.0.113.9"


def networks(text: str) -> tuple:
    return Config.from_env({"TALLY_TRUSTED_PROXIES": text}).trusted_proxies


LOOPBACK = networks("127.0.0.0/8 ::1")


def collect(client, body, *, raw: bytes | None = None, content_type: str = "text/plain",
            ua: str | None = FIREFOX, peer: str = CLIENT, headers: dict | None = None):
    data = raw if raw is not None else orjson.dumps(body)
    all_headers = {**({"User-Agent": ua} if ua else {}), **(headers or {})}
    return client.post("/api/v1/collect", data, headers=all_headers, content_type=content_type,
                       extra_environ={"REMOTE_ADDR": peer}, expect_errors=True)


def hit(site_id: str, **fields) -> dict:
    return {"s": site_id, "e": "pageview", "u": "https://example.com/pricing", **fields}


def site_int_id(db_path: str, public_id: str) -> int:
    return rows(db_path, "SELECT id FROM sites WHERE public_id = ?", (public_id,))[0]["id"]


def browser_key(db_path: str) -> bytes:
    return rows(db_path, "SELECT key FROM browser_id_key")[0]["key"]


def daily_id(db_path: str, site_id: int, ip: str, ua: str, day: int) -> int:
    salt = rows(db_path, "SELECT salt FROM visitor_salts WHERE day = ?", (day,))[0]["salt"]
    return visitor_id(salt, site_id, pack_ip(ip), ua, day)


def events(db_path: str) -> list[dict]:
    return rows(db_path, "SELECT * FROM events ORDER BY id")


# The endpoint ---------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", "text/plain;charset=UTF-8",
                                          "application/json"])
def test_event_with_browser_id_is_stored_under_the_browser_visitor(
        client, site, tally, db_path, content_type):
    resp = collect(client, hit(site["site"]["id"], v=BROWSER, r="https://news.ycombinator.com/",
                               w=1280, l="en-GB", t="Pricing"), content_type=content_type)
    assert resp.status_int == 204 and resp.body == b""
    assert resp.headers["Access-Control-Allow-Origin"] == "*"
    flush(tally)
    [event] = events(db_path)
    site_id = site_int_id(db_path, site["site"]["id"])
    assert event["visitor_id"] == browser_visitor_id(browser_key(db_path), site_id, BROWSER)
    assert (event["pathname"], event["referrer_host"], event["width"], event["language"],
            event["title"], event["browser"]) == (
        "/pricing", "news.ycombinator.com", 1280, "en-GB", "Pricing", "Firefox")
    assert event["session_id"] is not None


def test_without_browser_id_the_daily_ip_ua_hash_applies(client, site, tally, db_path, clock):
    assert collect(client, hit(site["site"]["id"])).status_int == 204
    flush(tally)
    site_id = site_int_id(db_path, site["site"]["id"])
    day = int(clock() * 1000) // 86_400_000
    assert events(db_path)[0]["visitor_id"] == daily_id(db_path, site_id, CLIENT, FIREFOX, day)


def test_the_browser_is_one_visitor_across_days_and_sites_differ(client, site, tally, db_path,
                                                                 clock, directory):
    other = directory.create_site(site["account"]["id"], ["example.com"])["id"]
    assert collect(client, hit(site["site"]["id"], v=BROWSER)).status_int == 204
    clock.advance(3 * 86_400)
    assert collect(client, hit(site["site"]["id"], v=BROWSER), peer="198.51.100.7",
                   ua=FIREFOX + " changed").status_int == 204
    assert collect(client, hit(other, v=BROWSER)).status_int == 204
    flush(tally)
    first, later, elsewhere = events(db_path)
    assert first["visitor_id"] == later["visitor_id"] != elsewhere["visitor_id"]
    assert first["session_id"] != later["session_id"]  # days apart: two visits


def test_a_server_event_from_the_same_ip_and_ua_joins_the_browser_visitor(
        client, site, tally, db_path):
    site_id = site["site"]["id"]
    assert collect(client, hit(site_id, v=BROWSER)).status_int == 204
    flush(tally)
    resp = client.post("/api/v1/events", orjson.dumps(hit(site_id, e="Signup", ip=CLIENT,
                                                           ua=FIREFOX)),
                       headers=bearer(site["key"]), content_type="application/json")
    assert resp.status_int == 204
    flush(tally)
    browser, server = events(db_path)
    assert server["visitor_id"] == browser["visitor_id"]
    assert server["session_id"] == browser["session_id"]


def test_server_identify_links_the_user_to_earlier_days_of_the_browser(
        client, site, tally, db_path, clock):
    site_id = site["site"]["id"]
    assert collect(client, hit(site_id, v=BROWSER, u="https://example.com/?utm_source=newsletter"
                                                     "&utm_medium=email")).status_int == 204
    clock.advance(2 * 86_400)  # another day: another salt, another ip+ua id
    assert collect(client, hit(site_id, v=BROWSER)).status_int == 204
    flush(tally)
    identify = {"s": site_id, "e": "$identify", "u": "https://example.com/", "uid": "user-7",
                "ip": CLIENT, "ua": FIREFOX}
    assert client.post("/api/v1/events", orjson.dumps(identify), headers=bearer(site["key"]),
                       content_type="application/json").status_int == 204
    flush(tally)
    payment = {"payment_id": "pay_1", "amount": 20, "currency": "EUR", "kind": "charge",
               "status": "succeeded", "paid_at": "2026-09-23T15:00:00Z",
               "customer": {"id": "cus_1", "user_id": "user-7"}}
    assert client.post("/api/v1/payments", orjson.dumps(payment), headers=bearer(site["key"]),
                       content_type="application/json").status_int == 200
    record = client.get("/api/v1/customers/cus_1", headers=bearer(site["key"])).json["data"]
    assert record["attribution"]["channel"] == "Email"
    assert record["attribution"]["first_seen"] == "2026-09-21T14:13:20.000Z"


def test_payment_with_the_script_visitor_id_attributes_to_its_earliest_session(
        client, site, tally, db_path, clock):
    site_id = site["site"]["id"]
    assert collect(client, hit(site_id, v=BROWSER, u="https://example.com/?gclid=abc")
                   ).status_int == 204
    clock.advance(21 * 86_400)  # three weeks later, a direct visit, then the purchase
    assert collect(client, hit(site_id, v=BROWSER)).status_int == 204
    flush(tally)
    payment = {"payment_id": "pay_2", "amount": 49, "currency": "USD", "kind": "charge",
               "status": "succeeded", "paid_at": "2026-10-12T15:00:00Z",
               "customer": {"id": "cus_2", "visitor_id": BROWSER}}
    assert client.post("/api/v1/payments", orjson.dumps(payment), headers=bearer(site["key"]),
                       content_type="application/json").status_int == 200
    record = client.get("/api/v1/customers/cus_2", headers=bearer(site["key"])).json["data"]
    assert record["attribution"]["channel"] == "Paid Search"
    assert record["attribution"]["first_seen"] == "2026-09-21T14:13:20.000Z"
    # Stored as the visitor id its events carry (decimal), as the events API's ids are.
    assert record["visitor_id"] == str(events(db_path)[0]["visitor_id"])


def test_several_browsers_behind_one_ip_and_ua_the_latest_wins(client, site, tally, db_path,
                                                                clock):
    site_id = site["site"]["id"]
    assert collect(client, hit(site_id, v=BROWSER)).status_int == 204
    clock.advance(60)
    assert collect(client, hit(site_id, v=OTHER_BROWSER)).status_int == 204
    flush(tally)
    clock.advance(60)
    server = hit(site_id, e="Signup", ip=CLIENT, ua=FIREFOX)
    assert client.post("/api/v1/events", orjson.dumps(server), headers=bearer(site["key"]),
                       content_type="application/json").status_int == 204
    flush(tally)
    first, second, signup = events(db_path)
    assert first["visitor_id"] != second["visitor_id"]
    assert signup["visitor_id"] == second["visitor_id"]


def test_links_of_days_before_yesterday_are_forgotten(client, site, tally, db_path, clock):
    assert collect(client, hit(site["site"]["id"], v=BROWSER)).status_int == 204
    flush(tally)
    assert len(rows(db_path, "SELECT * FROM browser_links")) == 1
    clock.advance(2 * 86_400)
    assert collect(client, hit(site["site"]["id"])).status_int == 204
    flush(tally)
    assert rows(db_path, "SELECT * FROM browser_links") == []


@pytest.mark.parametrize(("body", "message"), [
    ({"s": "x", "e": "pageview", "u": "https://example.com/", "ip": "1.2.3.4"},
     "invalid event input: ip: unknown field"),
    ({"s": "x", "e": "pageview", "u": "https://example.com/", "ua": "curl"},
     "invalid event input: ua: unknown field"),
    ({"s": "x", "b": [{"e": "pageview", "u": "https://example.com/"}]},
     "invalid event input: b: unknown field"),
    ({"s": "x", "e": "pageview", "u": "ftp://example.com/"},
     "invalid event input: u: required, an absolute http or https URL of at most 2048 bytes"),
    *(({"s": "x", "e": "pageview", "u": "https://example.com/", "v": v},
       "invalid event input: v: must be the visitor id of tally.js, "
       "32 lower-case hexadecimal digits, optionally after 4 such digits and a dot")
      for v in ("ABC", BROWSER.upper(), "5131" + BROWSER, "513." + BROWSER, "5131." + BROWSER[1:],
                "5131-" + BROWSER, "5I31." + BROWSER, "." + BROWSER, BROWSER + ".5131", 5131)),
    ([1], "invalid event input: body: must be a JSON object"),
])
def test_messages_are_those_of_the_events_api(client, body, message):
    resp = collect(client, body)
    assert assert_envelope(resp, 400, "invalid_input")["message"] == message
    assert resp.headers["Access-Control-Allow-Origin"] == "*"


def test_site_and_hostname_checks(client, site):
    resp = collect(client, hit("site_nope"))
    assert assert_envelope(resp, 404, "not_found")["message"] == "no site site_nope"
    resp = collect(client, hit(site["site"]["id"], u="https://evil.example/"))
    assert assert_envelope(resp, 400, "invalid_input")["message"] == (
        "invalid event input: u: host evil.example is not a hostname of this site")


def test_size_limit_and_bad_json(client, site):
    resp = collect(client, None, raw=b"{" + b" " * 8_200 + b"}")
    assert assert_envelope(resp, 413, "invalid_input")["message"] == (
        "request body is larger than 8192 bytes")
    assert assert_envelope(collect(client, None, raw=b"{"), 400, "invalid_input")[
        "message"].startswith("invalid JSON: ")


def test_no_key_is_needed_and_a_key_changes_nothing(client, site, tally, db_path):
    resp = collect(client, hit(site["site"]["id"]), headers={"Authorization": "Bearer nope"})
    assert resp.status_int == 204


def test_bots_are_dropped_silently(client, site, tally, db_path):
    resp = collect(client, hit(site["site"]["id"], v=BROWSER), ua="Googlebot/2.1 (+http://www.google.com/bot.html)")
    assert resp.status_int == 204
    flush(tally)
    assert events(db_path) == []


def test_quota_applies(client, site, db_path, clock):
    seed_usage(db_path, site["account"]["id"], 10_000_000)
    assert_quota_refusal(collect(client, hit(site["site"]["id"])),
                         seconds_until_next_month(clock()))


def test_a_full_queue_is_503_with_retry_after(db_path, clock):
    app = create_app(config_for(db_path, queue_max=1, flush_interval=3600), clock=clock)
    app.flusher.busy_timeout_ms = 20
    app.flusher.backoff = (0.02, 0.1)
    client = webtest.TestApp(app)
    account = app.directory.create_account("Q", "scale")
    site_id = app.directory.create_site(account["id"], ["example.com"])["id"]
    blocker = WriteLock(db_path)
    try:
        assert collect(client, hit(site_id)).status_int == 204
        resp = collect(client, hit(site_id))
        assert_envelope(resp, 503, "rate_limited")
        assert resp.headers["Retry-After"] == "2"
        assert resp.headers["Access-Control-Allow-Origin"] == "*"
    finally:
        blocker.release()
        app.stop(timeout=5)
    assert len(events(db_path)) == 1


def test_cors_preflight(client):
    resp = client.options("/api/v1/collect", headers={
        "Origin": "https://shop.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert resp.status_int == 204
    assert resp.headers["Access-Control-Allow-Origin"] == "*"
    assert "POST" in resp.headers["Access-Control-Allow-Methods"]
    assert resp.headers["Access-Control-Allow-Headers"].lower() == "content-type"


# The client address ----------------------------------------------------------------


def test_forwarded_for_is_believed_only_from_a_trusted_proxy(client, site, tally, db_path, clock):
    site_id = site["site"]["id"]
    forwarded = {"X-Forwarded-For": "198.51.100.23"}
    assert collect(client, hit(site_id), peer="127.0.0.1", headers=forwarded).status_int == 204
    assert collect(client, hit(site_id), peer=CLIENT, headers=forwarded).status_int == 204
    flush(tally)
    day = int(clock() * 1000) // 86_400_000
    number = site_int_id(db_path, site_id)
    proxied, direct = events(db_path)
    assert proxied["visitor_id"] == daily_id(db_path, number, "198.51.100.23", FIREFOX, day)
    assert direct["visitor_id"] == daily_id(db_path, number, CLIENT, FIREFOX, day)


@pytest.mark.parametrize(("peer", "forwarded", "expected"), [
    ("203.0.113.9", None, "203.0.113.9"),
    ("203.0.113.9", "1.1.1.1", "203.0.113.9"),  # not a trusted peer: the header is ignored
    ("127.0.0.1", None, "127.0.0.1"),
    ("127.0.0.1", "1.1.1.1", "1.1.1.1"),
    ("127.0.0.1", "6.6.6.6, 1.1.1.1", "1.1.1.1"),  # the client wrote 6.6.6.6 itself
    ("127.0.0.1", "1.1.1.1, 10.0.0.2", "1.1.1.1"),  # 10.0.0.2: a trusted inner proxy
    ("127.0.0.1", "10.0.0.3, 10.0.0.2", "10.0.0.3"),  # every hop trusted: the left-most
    ("127.0.0.1", "1.1.1.1, garbage, 10.0.0.2", "10.0.0.2"),  # nothing left of garbage
    ("127.0.0.1", " [2001:db8::1]:4711 ", "2001:db8::1"),
    ("127.0.0.1", "1.1.1.1:443", "1.1.1.1"),
    ("::1", "2001:db8::7", "2001:db8::7"),
    ("::ffff:127.0.0.1", "::ffff:1.1.1.1", "1.1.1.1"),
    ("", "1.1.1.1", None),
])
def test_client_ip_rule(peer, forwarded, expected):
    trusted = LOOPBACK + networks("10.0.0.0/8")
    assert client_ip(peer, forwarded, trusted) == expected


def test_trusted_proxies_setting():
    assert Config.from_env({}).trusted_proxies == LOOPBACK
    config = Config.from_env({"TALLY_TRUSTED_PROXIES": "10.0.0.0/8, 192.0.2.1 ::1"})
    assert [str(n) for n in config.trusted_proxies] == ["10.0.0.0/8", "192.0.2.1/32", "::1/128"]
    assert Config.from_env({"TALLY_TRUSTED_PROXIES": "none"}).trusted_proxies == ()
    with pytest.raises(ConfigError, match="TALLY_TRUSTED_PROXIES: 'nope' is not an IP"):
        Config.from_env({"TALLY_TRUSTED_PROXIES": "10.0.0.0/8,nope"})


# The script -----------------------------------------------------------------------


def test_script_is_at_most_2000_bytes_gzipped():
    assert len(gzip.compress(script_bytes(), 9)) <= 2_000


def test_script_is_served_cacheable_with_an_etag(tally):
    app = webtest.TestApp(tally.wsgi)  # no decoding: see the bytes as sent
    resp = app.get("/js/tally.js")
    assert resp.body == script_bytes()
    assert resp.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert "max-age=86400" in resp.headers["Cache-Control"]
    etag = resp.headers["ETag"]
    again = app.get("/js/tally.js", headers={"If-None-Match": etag}, status=304)
    assert again.body == b"" and again.headers["ETag"] == etag
    assert app.get("/js/tally.js", headers={"If-None-Match": '"other"'}).status_int == 200
    assert app.head("/js/tally.js").headers["ETag"] == etag


def test_script_is_sent_gzipped_when_accepted(tally):
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/js/tally.js", "SERVER_NAME": "x",
               "SERVER_PORT": "80", "wsgi.url_scheme": "http", "HTTP_ACCEPT_ENCODING": "gzip",
               "wsgi.errors": io.StringIO(), "wsgi.input": io.BytesIO()}
    seen = {}

    def start_response(status, headers, exc_info=None):
        seen["status"], seen["headers"] = status, {k.lower(): v for k, v in headers}

    body = b"".join(tally.wsgi(environ, start_response))
    assert seen["status"] == "200 OK"
    assert seen["headers"]["content-encoding"] == "gzip"
    assert seen["headers"]["vary"] == "Accept-Encoding"
    assert gzip.decompress(body) == script_bytes() and len(body) <= 2_000


def test_a_stripe_checkout_carrying_the_script_visitor_id_attributes_too(client, site, tally,
                                                                         db_path):
    from tests.stripe_events import stripe_object, unix
    from tests.test_stripe_http import Stripe, set_secret

    site_id = site["site"]["id"]
    assert collect(client, hit(site_id, v=BROWSER, u="https://example.com/?gclid=abc")
                   ).status_int == 204
    flush(tally)
    set_secret(db_path, site_id)
    session = stripe_object("checkout.session", customer="cus_s", mode="payment",
                            subscription=None, payment_intent=None,
                            created=unix("2026-09-21T15:00:00Z"),
                            metadata={"tally_visitor_id": BROWSER})
    assert Stripe(client, site_id).send("checkout.session.completed", session,
                                        "2026-09-21T15:00:00Z") == "applied"
    record = client.get("/api/v1/customers/cus_s", headers=bearer(site["key"])).json["data"]
    assert record["attribution"]["channel"] == "Paid Search"
    assert record["visitor_id"] == str(events(db_path)[0]["visitor_id"])
