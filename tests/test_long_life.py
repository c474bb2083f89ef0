"""Weeks of a shop's life on one install, then what an operator does to it for years:
restart, check, back up while traffic flows, restore somewhere new and start from there,
and upgrade a database the previous release made. On both backends.

Real parts only: gunicorn serving Tally (tests/clocked_app.py: only its clock is the
test's, read from a file, so three weeks pass in seconds), headless Chromium running the
real /js/tally.js on a shop's pages, the `tally` command, signed Stripe deliveries, the
dashboard after a real sign-in. Every 204 and 200 the service gives is written in a ledger
(tests/lifecycle.py), and each acknowledged event must be found stored (or set aside as a
dead letter, or deleted on purpose by prune or erasure), each payment stored. Every report
(API, CSV, dashboard pages, shared links, filters, goals, hours; tests/lifecycle.py lists
them) must read the same after a restart and from the restored copy.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import orjson
import pytest

from tests.conftest import bearer, cli_json, http, is_postgres, latest_version, rows, run_cli
from tests.lifecycle import (
    DAY,
    HIDE_WEBDRIVER,
    RECORD_ANSWERS,
    ClockFile,
    Ledger,
    ShopPages,
    api_paths,
    assert_same,
    browse,
    clocked_server,
    dead_letter_markers,
    fresh_place,
    marker_of,
    page_paths,
    report_snapshot,
    share_paths,
    sign_in,
    stored_markers,
    stored_payments,
    wait_until,
)
from tests.stripe_events import (
    SECRET,
    charge,
    invoice,
    invoice_line,
    price,
    refund,
    sign,
    stripe_event,
    stripe_object,
    subscription,
    unix,
)
from tests.test_deadletters import drop_trigger, poison_trigger

pytestmark = pytest.mark.slow

T0 = unix("2026-10-05T08:00:00Z")  # a Monday; the service lives until 2026-10-22
EMAIL, PASSWORD = "owner@shop.test", "a long enough password"
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
IPHONE = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15"
          " (KHTML, like Gecko) Version/17.0 Mobile/15E148 Safari/604.1")
EDGE = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko)"
        " Chrome/130.0.0.0 Safari/537.36 Edg/130.0.0.0")
VISITORS = {
    "google": {"ip": "81.2.69.160", "ua": FIREFOX, "r": "https://www.google.com/"},
    "news": {"ip": "2.16.6.1", "ua": IPHONE},
    "bing": {"ip": "91.198.174.192", "ua": EDGE, "r": "https://www.bing.com/search?q=shop"},
    "direct": {"ip": "203.0.113.7", "ua": FIREFOX},
    "load": {"ip": "198.51.100.20", "ua": EDGE},
}
FIXTURES = Path(__file__).resolve().parent / "data" / "tally-v14"


@pytest.fixture
def browser(chromium):
    added = [chromium.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                                      {"source": source})["identifier"]
             for source in (HIDE_WEBDRIVER, RECORD_ANSWERS)]
    yield chromium
    for identifier in added:
        chromium.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument",
                                 {"identifier": identifier})


class Shop:
    """One install: its database, its clock, the server of the moment, and the ledger."""

    def __init__(self, db: str, folder: Path):
        self.db = db
        self.folder = folder
        self.clock = ClockFile(folder, T0)
        self.ledger = Ledger()
        self.server = None
        self.servers = []  # every server started, stopped at the end whatever happens
        self.browser_markers: set[tuple[str, str]] = set()

    # the service ---------------------------------------------------------------------
    def start(self, db: str | None = None):
        self.server = clocked_server(db or self.db, self.clock,
                                     self.folder / f"server-{len(self.servers)}.log",
                                     env={"TALLY_FLUSH_INTERVAL": "0.2"})
        self.servers.append(self.server)
        return self.server

    def stop(self) -> None:
        server, self.server = self.server, None
        assert server.stop() == 0, server.log()[-3000:]  # SIGTERM drains the queues
        assert "could not be stored" not in server.log()

    def at(self, day: int, hour: int, minute: int = 0) -> None:
        self.clock.set(T0 + day * DAY + (hour - 8) * 3600 + minute * 60)

    def settle(self, db: str | None = None) -> None:
        """Until every acknowledged event is stored or set aside: a day's figures are
        stored once it is final, so the clock moves on only when nothing is queued."""
        db = db or self.db
        wait_until(lambda: stored_markers(db) + dead_letter_markers(db) == self.ledger.expected(),
                   message=lambda: f"{self.ledger.expected() - stored_markers(db)}"
                                   f" {self.server.log()[-2000:] if self.server else ''}")

    # what a shop sends -------------------------------------------------------------
    def events(self, site: dict, *items: tuple[str, str, str, dict]) -> None:
        batch, markers = [], []
        for visitor, name, path, extra in items:
            who = VISITORS[visitor]
            n = self.ledger.next_marker(site.get("prefix", ""))
            url = f"https://{site['host']}{path}{'&' if '?' in path else '?'}n={n}"
            event = {"e": name, "u": url, "ip": who["ip"], "ua": who["ua"], **extra}
            if name == "pageview" and "r" in who and "utm_" not in path:
                event["r"] = who["r"]
            batch.append(event)
            markers.append((n, name))
        status, _, body = http("POST", self.server.url + "/api/v1/events",
                               orjson.dumps({"s": site["id"], "b": batch}),
                               {**bearer(site["key"]), "Content-Type": "application/json"})
        assert status == 204, body
        for marker in markers:
            self.ledger.acknowledged(marker, self.clock.day())

    def pay(self, site: dict, body: dict) -> None:
        status, _, answer = http("POST", self.server.url + "/api/v1/payments", orjson.dumps(body),
                                 {**bearer(site["key"]), "Content-Type": "application/json"})
        assert status == 200, answer
        self.ledger.payment(body["payment_id"])

    def stripe(self, site: dict, event_type: str, obj: dict, when: str,
               payment_id: str | None = None) -> None:
        payload = orjson.dumps(stripe_event(event_type, obj, created=unix(when)))
        status, _, answer = http(
            "POST", f"{self.server.url}/api/v1/integrations/stripe/{site['id']}", payload,
            {"Stripe-Signature": sign(payload), "Content-Type": "application/json"})
        assert status == 200 and orjson.loads(answer)["data"]["status"] == "applied", answer
        if payment_id:
            self.ledger.payment(payment_id)

    def browse(self, driver, pages: ShopPages, path: str, actions=(), expected: int = 1) -> str:
        n = self.ledger.next_marker()
        answers = browse(driver, pages.url(f"{path}{'&' if '?' in path else '?'}n={n}"), actions,
                         expected)
        assert [status for _, _, status in answers] == [204] * expected, answers
        for name, url, _ in answers:
            marker = marker_of(url, name)
            self.ledger.acknowledged(marker, self.clock.day())
            self.browser_markers.add(marker)
        return driver.execute_script("return tally.visitorId()")

    # reports --------------------------------------------------------------------------
    def reports(self, world: dict, session) -> dict:
        first, last = "2026-10-01", self.clock.day()
        api = api_paths(first, last, self.clock.day(-2), ("2026-10-10", last))
        found = report_snapshot(self.server.url, world["a"]["key"], api,
                                page_paths(world["a"]["id"], first, last), session,
                                share_paths(world["share"], first, last))
        site, final = world["a"]["id"], self.clock.day(-2)  # days final for the command too
        found["tally report traffic"] = cli_json(
            "report", "traffic", "--site", site, "--from", first, "--to", final, "--by", "page",
            db=self.db)
        found["tally report mrr"] = cli_json("report", "mrr", "--site", site, "--at", final,
                                             "--from", first, "--to", final, db=self.db)
        found["tally report revenue --csv"] = run_cli(
            "report", "revenue", "--site", site, "--from", first, "--to", final, "--csv",
            db=self.db).stdout
        return found


def setup(shop: Shop) -> dict:
    db = shop.db
    cli_json("init", db=db)
    account = cli_json("account", "create", "--name", "Shop", "--plan", "scale", db=db)
    other = cli_json("account", "create", "--name", "Load", "--plan", "scale", db=db)
    world = {}
    for name, owner, host, prefix in (("a", account, "shop.test", ""),
                                      ("b", other, "load.test", "b")):
        site = cli_json("site", "create", "--account", owner["id"], "--host", host, db=db)
        key = cli_json("key", "create", "--site", site["id"], "--scope", "events", "--scope",
                       "payments", "--scope", "read", db=db)
        world[name] = {"id": site["id"], "key": key["key"], "host": host, "prefix": prefix}
    run_cli("user", "create", "--email", EMAIL, "--account", account["id"], "--password-stdin",
            db=db, input_text=PASSWORD + "\n")
    run_cli("stripe", "set-secret", "--site", world["a"]["id"], db=db, input_text=SECRET + "\n")
    world["share"] = cli_json("share", "create", "--site", world["a"]["id"], "--revenue",
                              db=db)["url"].removeprefix("/share/")
    return world


def weeks(shop: Shop, world: dict, driver, pages: ShopPages) -> None:
    """Seventeen days of a shop: visits from search, e-mail and direct, custom events, an
    identified user, a browser with the real script, payments, a Stripe subscription and a
    refund, a dead letter, then retention and two erasures, then more days."""
    a = world["a"]
    pages.tally_port, pages.site = shop.server.port, a["id"]
    browser_visitor = None
    for day in range(14):
        shop.at(day, 9)
        shop.events(a, ("direct", "pageview", "/docs", {"t": "Docs"}))
        if day % 2 == 0:
            shop.at(day, 10)
            shop.events(a, ("google", "pageview", "/", {"t": "Home"}))
            shop.at(day, 10, 3)
            shop.events(a, ("google", "pageview", "/pricing", {}),
                        ("google", "Signup", "/pricing", {"p": {"plan": "pro" if day % 4 else "team"}}))
        if day in (1, 4, 8):
            shop.at(day, 13)
            shop.events(a, ("news", "pageview",
                            "/?utm_source=newsletter&utm_medium=email&utm_campaign=autumn", {}))
            shop.at(day, 13, 4)
            shop.events(a, ("news", "pageview", "/blog/launch", {"t": "Launch"}))
        if day in (3, 9, 12):
            shop.at(day, 16)
            shop.events(a, ("bing", "pageview", "/pricing", {}),
                        ("bing", "Download", "/pricing", {"p": {"file": "price-list.pdf"}}))
        if day == 1:
            shop.at(day, 11)
            shop.browse(driver, pages, "/landing?utm_source=twitter&utm_medium=social",
                        ("document.getElementById('buy').click()",
                         "tally('identify', 'user-carol')"), expected=3)
        if day == 2:
            shop.at(day, 10, 5)
            shop.events(a, ("google", "$identify", "/account", {"uid": "user-ada"}))
            shop.pay(a, {"payment_id": "pay_ada_1", "amount": 49, "currency": "EUR", "fee": 1.72,
                         "kind": "charge", "paid_at": "2026-10-07T10:06:00Z",
                         "customer": {"id": "cus_ada", "email": "ada@example.com",
                                      "user_id": "user-ada", "name": "Ada L", "country": "GB"},
                         "subscription": {"id": "sub_ada", "plan": "Pro", "interval": "month",
                                          "amount": 49}})
        if day == 4:
            shop.at(day, 15)
            browser_visitor = shop.browse(driver, pages, "/pricing")
            shop.at(day, 15, 2)
            checkout = stripe_object("checkout.session", customer="cus_carol", mode="subscription",
                                     subscription="sub_carol", payment_intent=None,
                                     created=unix("2026-10-09T15:02:00Z"),
                                     metadata={"tally_visitor_id": browser_visitor,
                                               "tally_user_id": "user-carol"})
            shop.stripe(a, "checkout.session.completed", checkout, "2026-10-09T15:02:00Z")
            team = price("price_team", 2000, product="prod_team", nickname="Team")
            shop.stripe(a, "customer.subscription.created",
                        subscription("sub_carol", "cus_carol", [(team, 1)], status="active",
                                     start="2026-10-09T15:02:00Z"), "2026-10-09T15:02:00Z")
            shop.stripe(a, "charge.succeeded", charge("ch_carol_1", 2000, customer="cus_carol",
                                                      created="2026-10-09T15:03:00Z"),
                        "2026-10-09T15:03:00Z", payment_id="ch_carol_1")
            shop.stripe(a, "invoice.paid", invoice(
                "in_carol_1", "sub_carol", "cus_carol", charge_id="ch_carol_1",
                paid="2026-10-09T15:03:00Z", lines=[invoice_line(
                    "sub_carol", 2000, start="2026-10-09", end="2026-11-09", product="prod_team")]),
                "2026-10-09T15:03:00Z")
        if day == 5:
            shop.at(day, 11)
            shop.pay(a, {"payment_id": "pay_bob_1", "amount": 120, "currency": "EUR",
                         "kind": "charge", "paid_at": "2026-10-10T11:00:00Z",
                         "customer": {"id": "cus_bob", "country": "DE"},
                         "metadata": {"order": "B-1"}})
        if day == 6:  # an event the database refuses: set aside, everything else stored
            shop.at(day, 12)
            shop.settle()
            poison_trigger(shop.db)
            try:
                shop.events(a, ("direct", "pageview", "/docs", {"t": "poison"}),
                            ("direct", "pageview", "/docs/start", {}))
                shop.settle()
            finally:
                drop_trigger(shop.db, "poison", "events")
            assert sum(dead_letter_markers(shop.db).values()) == 1
        if day == 9:
            shop.at(day, 12)
            shop.pay(a, {"payment_id": "pay_ada_refund", "amount": 10, "currency": "EUR",
                         "kind": "refund", "paid_at": "2026-10-14T12:00:00Z",
                         "customer": {"id": "cus_ada"}})
        if day == 11:
            shop.at(day, 12)
            shop.stripe(a, "refund.created", refund("re_carol_1", "ch_carol_1", 500,
                                                    created="2026-10-16T12:05:00Z"),
                        "2026-10-16T12:05:00Z", payment_id="re_carol_1")
        shop.settle()

    # Retention and erasure, as an operator runs them -----------------------------------
    shop.at(14, 8)
    before = stored_markers(shop.db)
    pruned = cli_json("prune", "--before", "2026-10-07", db=shop.db)
    removed = before - stored_markers(shop.db)
    assert removed == Counter({m: c for m, c in before.items()
                               if shop.ledger.days[m] < "2026-10-07"})
    assert pruned["events"] == sum(removed.values()) > 0 and pruned["days_stored"] > 0
    shop.ledger.deleted += removed

    erased = cli_json("customer", "erase", "--site", a["id"], "--customer", "cus_ada", db=shop.db)
    assert erased["customer"] == "cus_ada"
    assert stored_markers(shop.db) == before - removed  # no event of a customer is deleted

    before = stored_markers(shop.db)
    erased = cli_json("visitor", "erase", "--site", a["id"], "--visitor", browser_visitor, db=shop.db)
    removed = before - stored_markers(shop.db)
    assert removed == Counter({m: c for m, c in before.items() if m in shop.browser_markers})
    assert erased["events"] == sum(removed.values()) > 0
    shop.ledger.deleted += removed

    for day in (14, 15, 16):
        shop.at(day, 9)
        shop.events(a, ("direct", "pageview", "/docs", {}),
                    ("news", "pageview", "/blog/launch", {}))
        shop.at(day, 9, 30)
        shop.events(a, ("google", "pageview", "/", {}), ("google", "Signup", "/pricing",
                                                         {"p": {"plan": "pro"}}))
        if day == 15:
            shop.pay(a, {"payment_id": "pay_eve_1", "amount": 75, "currency": "EUR",
                         "kind": "charge", "paid_at": "2026-10-20T09:31:00Z",
                         "customer": {"id": "cus_eve", "email": "eve@example.com",
                                      "country": "FR"},
                         "subscription": {"id": "sub_eve", "plan": "Team", "interval": "year",
                                          "amount": 750}})
        shop.settle()
    shop.at(17, 14, 52)  # visitors on the site now: realtime and the live pages show them
    shop.events(a, ("bing", "pageview", "/", {}), ("direct", "pageview", "/docs", {}))
    shop.at(17, 14, 57)
    shop.events(a, ("bing", "pageview", "/pricing", {}))
    shop.settle()
    shop.at(17, 15)


def assert_nothing_acknowledged_lost(shop: Shop, db: str) -> None:
    assert stored_markers(db) + dead_letter_markers(db) == shop.ledger.expected()
    assert stored_payments(db) == shop.ledger.payments


def assert_check_ok(db: str, dead_letters: int = 1) -> None:
    check = cli_json("check", db=db)
    assert check["ok"] and check["integrity"] == "ok", check
    assert check["dead_letters"] == dead_letters


class Traffic:
    """A thread sending events (three a request) and now and then a payment to site b,
    recording each acknowledgement in the ledger."""

    def __init__(self, shop: Shop, site: dict):
        self.shop, self.site = shop, site
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.requests = 0
        self.failure: BaseException | None = None

    def _run(self) -> None:
        try:
            while not self.stopped.is_set():
                self.requests += 1
                self.shop.events(self.site, *[("load", "pageview", f"/item/{k}", {}) for k in range(3)])
                if self.requests % 4 == 0:
                    self.shop.pay(self.site, {
                        "payment_id": f"pay_load_{self.requests}", "amount": 5, "currency": "EUR",
                        "kind": "charge", "paid_at": "2026-10-22T15:00:00Z",
                        "customer": {"id": f"cus_load_{self.requests}"}})
                self.stopped.wait(0.02)  # a steady trickle, not all the CPU the machine has
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.failure = exc

    def acknowledged(self) -> tuple[Counter, set[str]]:
        ledger = self.shop.ledger
        with ledger._lock:
            return (Counter({m: c for m, c in ledger.events.items() if m[0].startswith("b")}),
                    {p for p in ledger.payments if p.startswith("pay_load_")})

    def wait_for(self, requests: int) -> None:
        wait_until(lambda: self.requests >= requests or self.failure is not None)
        assert self.failure is None, self.failure

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join(60)
        assert self.failure is None, self.failure


def site_b(markers: Counter) -> Counter:
    return Counter({m: c for m, c in markers.items() if m[0].startswith("b")})


def test_weeks_of_use_then_restart_backup_and_restore_lose_nothing(db_path, tmp_path, browser):
    browser.execute_cdp_cmd("Network.clearBrowserCookies", {})
    shop = Shop(db_path, tmp_path)
    world = setup(shop)
    pages = ShopPages()
    with ExitStack() as stack:
        stack.callback(pages.close)
        shop.start()
        stack.callback(lambda: [server.stop() for server in shop.servers])
        weeks(shop, world, browser, pages)
        session = sign_in(shop.server.url, EMAIL, PASSWORD)
        first = shop.reports(world, session)
        assert first[f"/api/v1/stats/aggregate?from=2026-10-01&to={shop.clock.day()}"]["visitors"] > 20
        realtime = first["/api/v1/stats/realtime"]  # the last 5 minutes, and 30 by minute
        assert realtime["visitors"] == 1
        assert sum(m["pageviews"] for m in realtime["pageviews_per_minute"]) == 3
        assert_check_ok(shop.db)
        letters = cli_json("deadletter", "list", db=shop.db)
        assert letters["total"] == 1 and letters["dead_letters"][0]["event"]["title"] == "poison"

        # A restart: every acknowledged event and payment is stored, every report the same.
        shop.stop()
        assert_nothing_acknowledged_lost(shop, shop.db)
        shop.start()
        again = shop.reports(world, session)
        assert_same(first, again)

        # A backup while traffic flows, restored into a new place, served from there.
        backup_path = tmp_path / "backup"
        with Traffic(shop, world["b"]) as traffic:
            traffic.wait_for(10)
            events, payments = traffic.acknowledged()
            wait_until(lambda: not events - stored_markers(shop.db))  # flushed: in the file
            backup = cli_json("backup", str(backup_path), db=shop.db)
            traffic.wait_for(traffic.requests + 10)  # and traffic went on
        assert backup["integrity"] == "ok"
        restored_db = fresh_place(shop.db, tmp_path, stack)
        restored = cli_json("restore", str(backup_path), db=restored_db)
        assert restored["check"]["ok"] and restored["user_version"] == backup["user_version"]
        if not is_postgres(restored_db):
            assert not Path(restored_db + "-wal").exists()
        live = shop.server
        shop.start(restored_db)
        from_backup = shop.reports(world, session)
        assert_same(first, from_backup)
        kept = stored_markers(restored_db)
        all_events, all_payments = traffic.acknowledged()
        assert not events - site_b(kept) and not site_b(kept) - all_events
        kept_payments = {p for p in stored_payments(restored_db) if p.startswith("pay_load_")}
        assert payments <= kept_payments <= all_payments
        assert kept - site_b(kept) + dead_letter_markers(restored_db) == shop.ledger.expected() - all_events
        assert_check_ok(restored_db)
        shop.stop()

        # The live service stores all the traffic it acknowledged, through its last SIGTERM.
        shop.server = live
        shop.settle()
        shop.stop()
        assert_nothing_acknowledged_lost(shop, shop.db)
        assert_check_ok(shop.db)
        ledger = shop.ledger
        print(f"\nlong life ({'postgres' if is_postgres(db_path) else 'sqlite'}):"
              f" {sum(ledger.events.values())} events and {len(ledger.payments)} payments"
              f" acknowledged, {sum(ledger.deleted.values())} deleted by prune and erasure,"
              f" {len(first)} reports compared three times")


# The previous release's database -------------------------------------------------------

def test_a_database_of_the_previous_release_gives_the_same_reports(backend, tmp_path):
    """tests/data/tally-v14 was made by the release before schema version 15 (main at
    d739043) through its CLI and HTTP (make_v14_fixtures.py): twelve days with stored final
    days in version 14's layout of traffic_day_dimensions, payments, a subscription, a
    Stripe customer, a dashboard user and a shared link, with every report it gave. The
    current release opens it (SQLite: the file; PostgreSQL: `tally restore` of that
    release's `tally backup` archive) and must give the same reports."""
    world = json.loads((FIXTURES / "world.json").read_text())
    with ExitStack() as stack:
        if backend == "sqlite":
            db = str(tmp_path / "tally.db")
            shutil.copyfile(FIXTURES / "tally-v14.db", db)
            ids = world
            conn = sqlite3.connect(db)
            try:
                assert conn.execute("PRAGMA user_version").fetchone()[0] == 14
                layout = [r[1] for r in conn.execute("PRAGMA table_info(traffic_day_dimensions)")]
                assert layout == ["site_id", "day", "dimension"]  # the layout 3.40 misread
            finally:
                conn.close()
        else:
            ids = world["postgres"]
            from tests.realparts import POSTGRES_URL

            db = fresh_place(POSTGRES_URL, tmp_path, stack, schema=ids["schema"])
            restored = cli_json("restore", str(FIXTURES / "tally-v14.pgdump"), db=db)
            assert restored["user_version"] == 14 and restored["check"]["ok"], restored
        recorded = json.loads((FIXTURES / f"reports-{backend}.json").read_text())
        assert rows(db, "SELECT count(*) AS n FROM traffic_day_dimensions")[0]["n"] > 0

        clock = ClockFile(tmp_path, world["now"])
        server = clocked_server(db, clock, tmp_path / "server.log",
                                env={"TALLY_FLUSH_INTERVAL": "0.2"})
        stack.callback(server.stop)
        now = {}
        for path in recorded:
            if not path.startswith("/"):
                continue
            status, _, body = http("GET", server.url + path, headers=bearer(ids["key"]))
            assert status == 200, (path, body)
            now[path] = body.decode() if "format=csv" in path else orjson.loads(body)["data"]
        assert http("GET", server.url + ids["share"])[0] == 200
        session = sign_in(server.url, world["email"], world["password"])
        assert session.get(f"{server.url}/sites/{ids['site']}", timeout=30).status_code == 200
        assert server.stop() == 0
        now["tally report traffic --by page"] = cli_json(
            "report", "traffic", "--site", ids["site"], "--from", world["first"],
            "--to", "2026-09-10", "--by", "page", db=db)
        api = {path: recorded[path] for path in now}
        # JSON numbers as the old release wrote them (49.00 read as 49.0 either way).
        assert_same(json.loads(json.dumps(api)), json.loads(json.dumps(now)))
        assert_check_ok(db, dead_letters=0)
        version = rows(db, "PRAGMA user_version" if backend == "sqlite"
                       else "SELECT version AS user_version FROM tally_schema_version")
        assert version == [{"user_version": latest_version(db)}]
        if backend == "sqlite":
            assert rows(db, "PRAGMA quick_check") == [{"quick_check": "ok"}]
