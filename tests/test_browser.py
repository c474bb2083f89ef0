"""The tracking script in real headless Chromium (Debian's chromium + chromium-driver).

One browser per test process (tests.conftest.chromium); one in-process server per test, on the test's own database
(either backend). The server is a threaded WSGI server
on 127.0.0.1 that Chromium reaches as `shop.test` (the pages), `tally.test` (Tally: the
script and the collect endpoint, created with a FakeClock) and `other.test` (a page
elsewhere); the host resolver rules map them to loopback, so the pages are not local.
Selenium sets navigator.webdriver, which silences the script: a script injected into
every new document hides it, except in the test that checks the silence.
"""

from __future__ import annotations

import re
import socketserver
import threading
import time
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
import pytest
import webtest
from selenium.webdriver.common.actions.action_builder import ActionBuilder
from selenium.webdriver.common.actions.mouse_button import MouseButton

from app import create_app
from attribution.first_touch import rfc3339_ms
from attribution.identity import identity_hash
from enrichment.browser_ids import browser_visitor_id
from enrichment.visitor import visitor_id
from storage.identity_secrets import new_secret, replace_secret
from tests.conftest import WAIT, FakeClock, bearer, config_for, rows
from tests.realparts import DESKTOP_UA
from validation.event import pack_ip

pytestmark = pytest.mark.browser

HIDE_WEBDRIVER = ("Object.defineProperty(Navigator.prototype, 'webdriver',"
                  " {get: () => false, configurable: true});")
QUEUE_STUB = ("<script>window.tally = window.tally || function () {"
              " (tally.q = tally.q || []).push(arguments) };"
              " tally('event', 'Early', {step: '1'}); tally('identify', 'early-user');</script>")
PROXIED_PATHS = {"/t/tally.js": "/js/tally.js", "/t/collect": "/api/v1/collect"}
BODIES = {
    "plain": "<h1>Shop</h1>",
    "buttons": ('<button id="buy" data-tally-event="Signup" data-tally-prop-plan="pro"'
                ' data-tally-prop-period="year"><span id="inner">Buy</span></button>'),
    "links": ('<a id="out" href="http://other.test:{port}/away">Elsewhere</a>'
              '<a id="pdf" href="/files/report.pdf">Report</a>'),
}


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class World:
    def __init__(self, db_path: str):
        self.db_path = db_path
        self.clock = FakeClock()
        self.app = create_app(config_for(db_path), clock=self.clock)
        self.client = webtest.TestApp(self.app)
        self.server = make_server("127.0.0.1", 0, self.dispatch, server_class=ThreadingServer,
                                  handler_class=QuietHandler)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.account = self.app.directory.create_account("Shop", "scale")
        self.proxied_requests = 0

    def dispatch(self, environ, start_response):
        host = environ.get("HTTP_HOST", "").rsplit(":", 1)[0]
        if host == "tally.test":
            return self.app(environ, start_response)
        proxied = PROXIED_PATHS.get(environ["PATH_INFO"])
        if proxied is not None:  # the customer's own domain passing /t/ on to Tally
            self.proxied_requests += 1
            return self.app({**environ, "PATH_INFO": proxied}, start_response)
        if environ["PATH_INFO"].startswith("/files/"):
            start_response("200 OK", [("Content-Type", "application/pdf"),
                                      ("Content-Disposition", "attachment")])
            return [b"%PDF-1.4\n"]
        if environ["PATH_INFO"] == "/away":
            body = b"<!doctype html><title>away</title><p>Another site</p>"
        else:
            body = self.page(environ).encode()
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"),
                                  ("Cache-Control", "no-store")])
        return [body]

    def page(self, environ) -> str:
        query = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        name = environ["PATH_INFO"].strip("/").split("/")[0] or "plain"
        attrs = " ".join(f"data-{flag}" for flag in query.get("flags", "").split(",") if flag)
        head = QUEUE_STUB if "queue" in query else ""
        src = f"http://tally.test:{self.port}/js/tally.js"
        if "proxied" in query:
            src, attrs = "/t/tally.js", attrs + ' data-api="/t/collect"'

        body = BODIES.get(name, BODIES["plain"]).format(port=self.port)
        return (f"<!doctype html><html><head><title>{name}</title>{head}</head><body>{body}"
                f'<script defer src="{src}"'
                f' data-site="{query.get("site", "")}" {attrs}></script></body></html>')

    def new_site(self, *hosts: str) -> dict:
        site = self.app.directory.create_site(self.account["id"], list(hosts or ("shop.test",)))
        key = self.app.directory.create_key(site["id"], ["events", "payments", "read"])
        number = rows(self.db_path, "SELECT id FROM sites WHERE public_id = ?", (site["id"],))
        return {"id": site["id"], "number": number[0]["id"], "key": key["key"]}

    def url(self, site: dict, path: str = "/plain", host: str = "shop.test", **query) -> str:
        params = "&".join(f"{k}={v}" for k, v in {"site": site["id"], **query}.items())
        sep = "&" if "?" in path else "?"
        return f"http://{host}:{self.port}{path}{sep}{params}"

    def events(self, site: dict, count: int, timeout: float = WAIT) -> list[dict]:
        """The site's stored events once there are `count` (fails after `timeout` s), in the
        order they reached Tally: requests sent at once (a pageview and a click, or
        an identify) may arrive in either order, so look such events up by name."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.app.flusher.flush_now(timeout=timeout)
            found = rows(self.db_path, "SELECT * FROM events WHERE site_id = ? ORDER BY id",
                         (site["number"],))
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, f"{len(found)} of {count} events: {found}"
            time.sleep(0.05)

    def browser_visitor(self, site: dict, browser_id: str) -> int:
        key = rows(self.db_path, "SELECT key FROM browser_id_key")[0]["key"]
        return browser_visitor_id(key, site["number"], browser_id)

    def daily_visitor(self, site: dict) -> int:
        day = int(self.clock() * 1000) // 86_400_000
        salt = rows(self.db_path, "SELECT salt FROM visitor_salts WHERE day = ?", (day,))[0]
        return visitor_id(salt["salt"], site["number"], pack_ip("127.0.0.1"), DESKTOP_UA, day)


@pytest.fixture
def world(db_path):
    world = World(db_path)
    world.thread.start()
    yield world
    world.server.shutdown()
    world.server.server_close()
    world.app.stop(timeout=5)


@pytest.fixture
def driver(world, chromium):
    """The test process's browser (tests.conftest.chromium), navigator.webdriver hidden."""
    chromium.hide_webdriver = chromium.execute_cdp_cmd(
        "Page.addScriptToEvaluateOnNewDocument", {"source": HIDE_WEBDRIVER})["identifier"]
    yield chromium
    chromium.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument",
                             {"identifier": chromium.hide_webdriver})


def load(driver, url: str) -> None:
    driver.get(url)
    # The script is deferred: it has run once tally.visitorId exists.
    deadline = time.monotonic() + WAIT
    while not driver.execute_script("return !!(window.tally && window.tally.visitorId)"):
        assert time.monotonic() < deadline, "tally.js did not run"
        time.sleep(0.02)


def wait_for_url(driver, part: str) -> None:
    deadline = time.monotonic() + WAIT
    while part not in driver.current_url:
        assert time.monotonic() < deadline, driver.current_url
        time.sleep(0.02)


def props(event: dict):
    return orjson.loads(event["props"]) if event["props"] else None


def by_name(events: list[dict]) -> dict[str, dict]:
    """Events sent at once, by name (one of each): their arrival order is not sending order."""
    named = {e["name"]: e for e in events}
    assert len(named) == len(events), [e["name"] for e in events]
    return named


# What it sends -----------------------------------------------------------------------


def test_a_pageview_with_the_page_details(world, driver):
    site = world.new_site()
    load(driver, world.url(site, "/plain", ref="1"))
    [event] = world.events(site, 1)
    assert event["name"] == "pageview"
    assert event["url"] == world.url(site, "/plain", ref="1")
    assert (event["hostname"], event["pathname"], event["title"]) == ("shop.test", "/plain", "plain")
    assert event["width"] > 0 and event["language"]
    assert (event["browser"], event["device"]) == ("Chrome", "desktop")
    browser_id = driver.execute_script("return tally.visitorId()")
    assert event["visitor_id"] == world.browser_visitor(site, browser_id)


def test_spa_navigations_are_pageviews_never_twice_for_one_url(world, driver):
    site = world.new_site()
    load(driver, world.url(site, "/plain"))
    driver.execute_script("history.pushState({}, '', '/plain/two' + location.search)")
    driver.execute_script("history.replaceState({}, '', location.href)")  # same URL
    driver.execute_script("location.hash = 'section'")  # not a pageview without data-hash
    driver.execute_script("history.pushState({}, '', '/plain/three' + location.search)")
    driver.execute_script("history.back()")  # popstate: back to /plain/two#section
    wait_for_url(driver, "/plain/two")
    driver.execute_script("tally('event', 'End')")  # sent after every pageview above
    events = world.events(site, 5)
    # Requests run concurrently, so arrival order is not sending order.
    assert sorted(e["pathname"] for e in events if e["name"] == "pageview") == [
        "/plain", "/plain/three", "/plain/two", "/plain/two"]
    assert len({e["session_id"] for e in events}) == 1


def test_hash_mode_counts_hash_changes(world, driver):
    site = world.new_site()
    load(driver, world.url(site, "/plain", flags="hash"))
    world.events(site, 1)
    driver.execute_script("location.hash = 'pricing'")
    world.events(site, 2)  # hashchange is handled later than the assignment: one at a time
    driver.execute_script("location.hash = 'pricing'")  # unchanged: nothing
    driver.execute_script("location.hash = 'faq'")
    wait_for_url(driver, "#faq")
    driver.execute_script("tally('event', 'End')")
    events = world.events(site, 4)
    assert sorted(e["url"].partition("#")[2] for e in events if e["name"] == "pageview") == [
        "", "faq", "pricing"]


def test_calls_queued_before_the_script_loads_are_replayed(world, driver):
    site = world.new_site()
    load(driver, world.url(site, "/plain", queue="1"))
    events = world.events(site, 3)
    by_name = {e["name"]: e for e in events}
    assert set(by_name) == {"pageview", "Early", "$identify"}
    assert props(by_name["Early"]) == {"step": "1"}
    assert by_name["$identify"]["uid"] == "early-user"


def test_a_tagged_element_sends_its_event_with_props(world, driver):
    site = world.new_site()
    load(driver, world.url(site, "/buttons"))
    driver.find_element("id", "inner").click()  # a click inside the tagged element
    events = by_name(world.events(site, 2))
    assert set(events) == {"pageview", "Signup"}
    assert props(events["Signup"]) == {"plan": "pro", "period": "year"}


def test_an_outbound_link_that_leaves_the_page_is_still_stored(world, driver):
    site = world.new_site()
    load(driver, world.url(site, "/links", flags="outbound"))
    driver.find_element("id", "out").click()
    events = by_name(world.events(site, 2))
    wait_for_url(driver, "other.test")  # the click did leave the page
    assert set(events) == {"pageview", "Outbound Link"}
    assert props(events["Outbound Link"]) == {"url": f"http://other.test:{world.port}/away"}


def test_a_middle_click_outbound_and_a_download_are_sent(world, driver):
    site = world.new_site()
    load(driver, world.url(site, "/links", flags="outbound,downloads"))
    main_window = driver.current_window_handle
    action = ActionBuilder(driver)
    action.pointer_action.move_to(driver.find_element("id", "out"))
    action.pointer_action.pointer_down(MouseButton.MIDDLE).pointer_up(MouseButton.MIDDLE)
    action.perform()
    driver.find_element("id", "pdf").click()
    events = world.events(site, 3)
    for handle in driver.window_handles:  # a middle click may open a tab
        if handle != main_window:
            driver.switch_to.window(handle)
            driver.close()
    driver.switch_to.window(main_window)
    sent = {e["name"]: props(e) for e in events}
    assert sent == {"pageview": None,
                    "Outbound Link": {"url": f"http://other.test:{world.port}/away"},
                    "File Download": {"url": f"http://shop.test:{world.port}/files/report.pdf"}}


def test_identify_links_the_user_to_the_browser_visitor_only_with_its_hash(world, driver):
    site = world.new_site()
    load(driver, world.url(site, "/plain"))
    driver.execute_script("tally('identify', 'user-42')")
    events = by_name(world.events(site, 2))  # the pageview may still be on its way
    assert set(events) == {"pageview", "$identify"}
    pageview, identify = events["pageview"], events["$identify"]
    assert identify["uid"] == "user-42"
    assert identify["visitor_id"] == pageview["visitor_id"]
    # Stored (and counted), but no server vouched for it: it links no one.
    links = "SELECT uid, visitor_id FROM visitor_identities WHERE site_id = ?"
    assert rows(world.db_path, links, (site["number"],)) == []
    secret = new_secret(lambda n: bytes(range(n)))
    replace_secret(world.app.db, site["number"], secret, 0)
    world.clock.advance(2)  # past the worker's one-second cache of secrets
    driver.execute_script("tally('identify', 'user-42', {hash: arguments[0]})",
                          identity_hash(secret, "user-42"))
    *_, signed = world.events(site, 3)
    assert (signed["uid"], signed["anonymous"]) == ("user-42", 1)
    assert rows(world.db_path, links, (site["number"],)) == [
        {"uid": "user-42", "visitor_id": pageview["visitor_id"]}]


# The visitor id -----------------------------------------------------------------------


def test_the_cookie_keeps_one_visitor_across_loads_and_days(world, driver):
    site = world.new_site()
    started_day = int(time.time()) // 86_400
    load(driver, world.url(site, "/plain"))
    cookie = driver.get_cookie("tally_vid")
    assert cookie["value"] == driver.execute_script("return tally.visitorId()")
    # A new browser's: the UTC day it was made (4 hex digits), a dot, 128 random bits.
    day, random_bits = cookie["value"].split(".")
    assert re.fullmatch("[0-9a-f]{4}", day) and re.fullmatch("[0-9a-f]{32}", random_bits)
    assert started_day <= int(day, 16) <= int(time.time()) // 86_400
    assert cookie["sameSite"] == "Lax" and cookie["path"] == "/"
    assert cookie["expiry"] > time.time() + 360 * 86_400
    load(driver, world.url(site, "/plain", load="2"))
    world.events(site, 2)
    world.clock.advance(86_400)  # the next day: another salt, the same browser
    load(driver, world.url(site, "/plain", load="3"))
    first, second, next_day = world.events(site, 3)
    assert driver.get_cookie("tally_vid")["value"] == cookie["value"]
    assert first["visitor_id"] == second["visitor_id"] == next_day["visitor_id"] == (
        world.browser_visitor(site, cookie["value"]))
    assert first["visitor_id"] >> 48 == 1 + int(day, 16) % 32_767
    assert first["session_id"] == second["session_id"] != next_day["session_id"]


@pytest.mark.parametrize("kept", ["0123456789abcdef0123456789abcdef",  # made before dating
                                  "4e20.fedcba9876543210fedcba9876543210"])
def test_a_cookie_of_either_shape_is_kept_and_sent_as_it_is(world, driver, kept):
    site = world.new_site()
    driver.execute_cdp_cmd("Network.setCookie", {"name": "tally_vid", "value": kept,
                                                 "domain": "shop.test", "path": "/"})
    load(driver, world.url(site, "/plain"))
    assert driver.execute_script("return tally.visitorId()") == kept
    [event] = world.events(site, 1)
    cookie = driver.get_cookie("tally_vid")
    assert cookie["value"] == kept and cookie["expiry"] > time.time() + 360 * 86_400
    assert event["visitor_id"] == world.browser_visitor(site, kept)


def test_cookieless_mode_sets_no_cookie_and_uses_the_daily_hash(world, driver):
    site = world.new_site()
    load(driver, world.url(site, "/plain", flags="cookieless"))
    assert driver.execute_script("return tally.visitorId()") is None
    [event] = world.events(site, 1)
    assert driver.get_cookie("tally_vid") is None
    assert event["visitor_id"] == world.daily_visitor(site)


def test_visitor_id_as_customer_visitor_id_attributes_to_the_earliest_session(world, driver):
    site = world.new_site()
    load(driver, world.url(site, "/plain", utm_source="google", utm_medium="cpc"))
    world.events(site, 1)
    world.clock.advance(20 * 86_400)  # weeks later, a direct visit, then the purchase
    load(driver, world.url(site, "/plain", back="1"))
    first, _ = world.events(site, 2)
    visitor = driver.execute_script("return tally.visitorId()")
    payment = {"payment_id": "pay_1", "amount": 49, "currency": "EUR", "kind": "charge",
               "status": "succeeded", "paid_at": rfc3339_ms(int(world.clock() * 1000)),
               "customer": {"id": "cus_1", "visitor_id": visitor}}
    headers = bearer(site["key"])
    assert world.client.post("/api/v1/payments", orjson.dumps(payment), headers=headers,
                             content_type="application/json").status_int == 200
    customer = world.client.get("/api/v1/customers/cus_1", headers=headers).json["data"]
    assert customer["attribution"]["channel"] == "Paid Search"
    assert customer["attribution"]["utm"]["source"] == "google"
    assert customer["attribution"]["first_seen"] == rfc3339_ms(first["ts"])
    assert customer["visitor_id"] == str(first["visitor_id"])


def test_a_server_event_from_the_same_ip_and_ua_is_the_same_visitor(world, driver):
    site = world.new_site()
    load(driver, world.url(site, "/plain"))
    [pageview] = world.events(site, 1)
    server_event = {"s": site["id"], "e": "Checkout", "u": "https://shop.test/checkout",
                    "ip": "127.0.0.1", "ua": DESKTOP_UA}
    assert world.client.post("/api/v1/events", orjson.dumps(server_event),
                             headers=bearer(site["key"]),
                             content_type="application/json").status_int == 204
    _, checkout = world.events(site, 2)
    assert checkout["visitor_id"] == pageview["visitor_id"] != world.daily_visitor(site)
    assert checkout["session_id"] == pageview["session_id"]


def test_the_script_proxied_through_the_sites_own_domain(world, driver):
    site = world.new_site()
    before = world.proxied_requests
    load(driver, world.url(site, "/plain", proxied="1"))
    driver.execute_script("tally('event', 'Proxied')")
    events = world.events(site, 2)
    assert sorted(e["name"] for e in events) == ["Proxied", "pageview"]
    assert world.proxied_requests - before == 3  # the script and both events went via /t/
    cookie = driver.get_cookie("tally_vid")["value"]
    assert {e["visitor_id"] for e in events} == {world.browser_visitor(site, cookie)}


# When it stays silent ------------------------------------------------------------------


def test_nothing_is_sent_under_navigator_webdriver(world, driver):
    site = world.new_site()
    driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument",
                           {"identifier": driver.hide_webdriver})
    try:
        load(driver, world.url(site, "/plain", automated="1"))
        assert driver.execute_script("return navigator.webdriver") is True
        driver.execute_script("tally('event', 'Automated')")
    finally:
        driver.hide_webdriver = driver.execute_cdp_cmd(
            "Page.addScriptToEvaluateOnNewDocument", {"source": HIDE_WEBDRIVER})["identifier"]
    load(driver, world.url(site, "/plain", sentinel="1"))  # sent after anything above
    [event] = world.events(site, 1)
    assert "sentinel=1" in event["url"]


def test_nothing_is_sent_on_localhost_or_when_ignored(world, driver):
    site = world.new_site("shop.test", "127.0.0.1", "localhost")
    load(driver, world.url(site, "/plain", host="127.0.0.1", local="ip"))
    load(driver, world.url(site, "/plain", host="localhost", local="name"))
    load(driver, world.url(site, "/plain"))
    [first] = world.events(site, 1)
    driver.execute_script("localStorage.tally_ignore = 'true'")
    load(driver, world.url(site, "/plain", ignored="1"))
    driver.execute_script("tally('event', 'Ignored')")
    driver.execute_script("localStorage.removeItem('tally_ignore')")
    load(driver, world.url(site, "/plain", host="127.0.0.1", flags="local"))  # data-local
    events = world.events(site, 2)
    assert [e["url"] for e in events] == [first["url"], world.url(site, "/plain",
                                                                  host="127.0.0.1",
                                                                  flags="local")]
