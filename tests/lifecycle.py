"""Helpers for tests that run Tally the way an operator does for years: a real gunicorn
whose clock the test sets, a shop's pages for real Chromium, every report a user can ask
for, a ledger of what the service acknowledged, and new places to restore into.
"""

from __future__ import annotations

import difflib
import os
import re
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import orjson

from tests.conftest import Server, http, is_postgres, rows
from tests.realparts import postgres_admin

CLOCKED_APP = "tests.clocked_app:app"
DAY = 86_400


class ClockFile:
    """The time every worker of a clocked server reads (tests/clocked_app.py)."""

    def __init__(self, folder: Path, start: float):
        self.path = folder / "clock"
        self.set(start)

    def set(self, when: float) -> None:
        partial = self.path.with_name("clock.partial")
        partial.write_text(repr(float(when)))
        os.replace(partial, self.path)  # a worker never reads half a number

    def advance(self, seconds: float) -> None:
        self.set(self() + seconds)

    def __call__(self) -> float:
        return float(self.path.read_text())

    def day(self, offset: int = 0) -> str:
        return time.strftime("%Y-%m-%d", time.gmtime(self() + offset * DAY))


def clocked_server(db: str, clock: ClockFile, log_path: Path, env: dict | None = None,
                   workers: int = 2) -> Server:
    return Server(db, workers, {"TEST_CLOCK_FILE": str(clock.path), **(env or {})},
                  log_path=log_path, app=CLOCKED_APP).wait_ready()


def wait_until(condition, timeout: float = 60.0, message=lambda: "") -> None:
    """Poll a condition; the deadline only bounds a hung test, it asserts nothing about speed."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message()
        time.sleep(0.05)


def fresh_place(db: str, folder: Path, stack: ExitStack, schema: str | None = None) -> str:
    """A new, empty place for a database like `db`: a path in a new folder, or a new
    PostgreSQL database whose URL keeps db's options (its search_path; `schema` names
    another), dropped on leaving."""
    if not is_postgres(db):
        return str(folder / f"restored-{uuid.uuid4().hex[:8]}" / "tally.db")
    if schema is not None:
        db = urlsplit(db)._replace(query=f"options={quote(f'-csearch_path={schema}')}").geturl()
    name = f"tally_r_{uuid.uuid4().hex[:12]}"
    admin = postgres_admin()
    try:
        admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        admin.close()

    def drop():
        admin = postgres_admin()
        try:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            admin.close()

    stack.callback(drop)
    return urlsplit(db)._replace(path=f"/{name}").geturl()


# The shop's pages, for real Chromium ---------------------------------------------------

HIDE_WEBDRIVER = ("Object.defineProperty(Navigator.prototype, 'webdriver',"
                  " {get: () => false, configurable: true});")
# Records the status of every request the tracking script sends, so the test can count
# what Tally acknowledged; the request itself goes out unchanged.
RECORD_ANSWERS = """
window.__tallyAnswers = [];
(function () {
  var send = window.fetch;
  window.fetch = function (url, options) {
    var sent = send.apply(this, arguments);
    sent.then(function (answer) {
      var body = JSON.parse(options.body);
      window.__tallyAnswers.push([body.e, body.u, answer.status]);
    }, function () { window.__tallyAnswers.push(["?", "?", 0]); });
    return sent;
  };
})();
"""


class ShopPages:
    """shop.test's pages (any path) with the tracking script from tally.test:<port>."""

    def __init__(self):
        self.tally_port = 0
        self.site = ""
        pages = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the stdlib's name
                path = urlsplit(self.path).path
                body = (f"<!doctype html><html><head><title>Shop {path}</title></head><body>"
                        f"<h1>Shop</h1><button id=\"buy\" data-tally-event=\"Signup\""
                        f" data-tally-prop-plan=\"team\">Buy</button>"
                        f"<script defer src=\"http://tally.test:{pages.tally_port}/js/tally.js\""
                        f" data-site=\"{pages.site}\"></script></body></html>").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Cache-Control", "no-store")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://shop.test:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def browse(driver, url: str, actions=(), expected: int = 1) -> list[tuple[str, str, int]]:
    """Load a page, run its actions (JavaScript), and return what Tally answered to each
    event the script sent: (name, url, status), once `expected` answers have come."""
    driver.get(url)
    deadline = time.monotonic() + 15
    while not driver.execute_script("return !!(window.tally && window.tally.visitorId)"):
        assert time.monotonic() < deadline, "tally.js did not run"
        time.sleep(0.02)
    for action in actions:
        driver.execute_script(action)
    while True:
        answers = driver.execute_script("return window.__tallyAnswers")
        if len(answers) >= expected:
            return [tuple(answer) for answer in answers]
        assert time.monotonic() < deadline, f"{len(answers)} of {expected} answers: {answers}"
        time.sleep(0.02)


# What was acknowledged -----------------------------------------------------------------

def marker_of(url: str, name: str) -> tuple[str, str]:
    """Every event the tests send carries n=<unique> in its URL: (n, event name)."""
    return parse_qs(urlsplit(url).query)["n"][0], name


class Ledger:
    """What the service acknowledged (204 for events, 200 for payments and Stripe events),
    to prove each one is stored, set aside as a dead letter, or deleted on purpose."""

    def __init__(self):
        self.events: Counter = Counter()  # (n, name) -> times acknowledged
        self.days: dict[tuple[str, str], str] = {}  # (n, name) -> UTC day it was sent
        self.payments: set[str] = set()
        self.deleted: Counter = Counter()  # by prune or erasure, on purpose
        self._count = 0
        self._lock = threading.Lock()

    def next_marker(self, prefix: str = "") -> str:
        with self._lock:
            self._count += 1
            return f"{prefix}{self._count}"

    def acknowledged(self, marker: tuple[str, str], day: str) -> None:
        with self._lock:
            self.events[marker] += 1
            self.days[marker] = day

    def payment(self, payment_id: str) -> None:
        with self._lock:
            self.payments.add(payment_id)

    def expected(self) -> Counter:
        return self.events - self.deleted


def stored_markers(db: str) -> Counter:
    return Counter(marker_of(row["url"], row["name"])
                   for row in rows(db, "SELECT url, name FROM events"))


def dead_letter_markers(db: str) -> Counter:
    return Counter(marker_of(event["url"], event["name"])
                   for event in (orjson.loads(row["event"])
                                 for row in rows(db, "SELECT event FROM dead_letters")))


def stored_payments(db: str) -> set[str]:
    return {row["payment_id"] for row in rows(db, "SELECT payment_id FROM payments")}


# Every report a user can ask for -------------------------------------------------------

BREAKDOWNS = ("channel", "source", "page", "entry_page", "country", "device", "browser", "os",
              "event", "medium", "campaign", "term", "content")
FUNNELS = ("page:/pricing,goal:Signup", "page:/*,goal:Signup,payment",
           "page:/,page:/pricing,goal:Download")
REVENUE_BY = ("channel", "source", "medium", "campaign", "term", "content", "referrer",
              "landing_page", "country", "device", "browser", "os", "plan")
FILTERS = ("visit:channel==Organic Search|Email", "event:page~/pricing", "visit:device!=mobile",
           "prop:plan==pro")


def api_paths(first: str, last: str, hours_from: str, days: tuple[str, ...]) -> list[str]:
    """Every stats request over the period, with filters, goals, comparisons, hours and CSV."""
    period = f"from={first}&to={last}"
    paths = [f"/api/v1/stats/aggregate?{period}",
             f"/api/v1/stats/aggregate?{period}&compare=previous_period",
             f"/api/v1/stats/aggregate?{period}&goal=Signup",
             f"/api/v1/stats/aggregate?{period}&goal=page:/pricing",
             f"/api/v1/stats/goals?{period}",
             "/api/v1/stats/realtime",
             f"/api/v1/stats/mrr/movements?{period}"]
    paths += [f"/api/v1/stats/breakdown?{period}&by={by}" for by in BREAKDOWNS]
    paths += [f"/api/v1/stats/breakdown?{period}&by=page&limit=2",
              f"/api/v1/stats/breakdown?{period}&by=channel&goal=Signup"]
    paths += [f"/api/v1/stats/revenue?{period}&by={by}" for by in REVENUE_BY]
    paths += [f"/api/v1/stats/revenue?{period}&compare=previous_period"]
    paths += [f"/api/v1/stats/mrr?at={day}" for day in days]
    paths += [f"/api/v1/stats/timeseries?{period}&interval={interval}"
              for interval in ("day", "week", "month")]
    paths += [f"/api/v1/stats/timeseries?from={hours_from}&to={last}&interval=hour",
              f"/api/v1/stats/timeseries?{period}&interval=day&goal=Signup",
              f"/api/v1/stats/timeseries?{period}&interval=week&compare=previous_period"]
    for text in FILTERS:
        filters = quote(text, safe="")
        paths += [f"/api/v1/stats/aggregate?{period}&filters={filters}",
                  f"/api/v1/stats/breakdown?{period}&by=page&filters={filters}",
                  f"/api/v1/stats/timeseries?{period}&interval=day&filters={filters}",
                  f"/api/v1/stats/revenue?{period}&filters={filters}",
                  f"/api/v1/stats/goals?{period}&filters={filters}"]
    paths += [f"/api/v1/stats/funnel?{period}&steps={steps}" for steps in FUNNELS]
    paths += [f"/api/v1/stats/funnel?{period}&steps={FUNNELS[1]}&filters="
              + quote(FILTERS[0], safe=""),
              f"/api/v1/stats/funnel?{period}&steps={FUNNELS[1]}&format=csv"]
    paths += [f"/api/v1/stats/breakdown?{period}&by=source&format=csv",
              f"/api/v1/stats/revenue?{period}&by=campaign&format=csv",
              f"/api/v1/stats/timeseries?from={hours_from}&to={last}&interval=hour&format=csv"]
    return paths


def page_paths(site: str, first: str, last: str) -> list[str]:
    """The dashboard's pages of the site (signed in)."""
    period = f"period=custom&from={first}&to={last}"
    return [f"/sites/{site}?period=7d", f"/sites/{site}?period=30d", f"/sites/{site}?{period}",
            f"/sites/{site}?{period}&filters={quote(FILTERS[0], safe='')}",
            f"/sites/{site}?{period}&goal=Signup", f"/sites/{site}/revenue",
            f"/sites/{site}/revenue?{period}&by=plan", f"/sites/{site}/live",
            f"/sites/{site}/funnels?{period}&steps={FUNNELS[1]}",
            f"/sites/{site}/settings", f"/sites/{site}/install", f"/sites/{site}/remove", "/"]


def share_paths(token: str, first: str, last: str) -> list[str]:
    return [f"/share/{token}", f"/share/{token}?period=custom&from={first}&to={last}",
            f"/share/{token}?period=7d&filters={quote(FILTERS[1], safe='')}",
            f"/share/{token}/live"]


def report_snapshot(base_url: str, key: str, api: list[str], pages, signed_in,
                    shared: list[str]) -> dict[str, object]:
    """Every report as the service answers it now: JSON data, CSV text, and the HTML of
    the dashboard's pages (signed in, with the cookies of `signed_in`, a requests.Session)
    and shared links. Asked four at a time, as a dashboard's users would."""
    from concurrent.futures import ThreadPoolExecutor

    cookies = "; ".join(f"{c.name}={c.value}" for c in signed_in.cookies)
    asks = ([(path, {"Authorization": f"Bearer {key}"}) for path in api]
            + [(path, {}) for path in shared] + [(path, {"Cookie": cookies}) for path in pages])

    def ask(item):
        path, headers = item
        status, _, body = http("GET", base_url + path, headers=headers)
        assert status == 200, (path, status, body[:500])
        if path.startswith("/api/"):
            return body.decode() if "format=csv" in path else orjson.loads(body)["data"]
        return _page_text(body.decode())

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, asks))
    return dict(zip([path for path, _ in asks], answers, strict=True))


def _page_text(html: str) -> str:
    # The port of the server is in no figure; everything else must be the same.
    return re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", html)


def sign_in(base_url: str, email: str, password: str):
    """A requests.Session signed in to the dashboard through its login form."""
    import requests

    session = requests.Session()
    page = session.get(base_url + "/login", timeout=30)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    resp = session.post(base_url + "/login", data={"email": email, "password": password,
                                                   "csrf": csrf, "next": ""},
                        allow_redirects=False, timeout=30)
    assert resp.status_code == 303, (resp.status_code, resp.text[:500])
    return session


class Differences(list):
    """The names of the reports that differ; shown with the first difference line by line."""

    def __init__(self, names, before: dict, after: dict):
        super().__init__(names)
        self.before, self.after = before, after

    def __repr__(self) -> str:
        if not self:
            return "[]"
        name = self[0]

        def lines(value) -> list[str]:
            text = value if isinstance(value, str) else orjson.dumps(
                value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
            return text.splitlines()

        diff = difflib.unified_diff(lines(self.before.get(name)), lines(self.after.get(name)),
                                    "before", "after", n=2, lineterm="")
        return f"{list(self)!r}\n{name}:\n" + "\n".join(list(diff)[:60])


def differences(before: dict, after: dict) -> Differences:
    """The reports that differ, named by request (the first one's difference in repr)."""
    names = sorted(set(before) | set(after))
    return Differences([name for name in names if before.get(name) != after.get(name)],
                       before, after)


def assert_same(before: dict, after: dict) -> None:
    found = differences(before, after)
    assert not found, repr(found)


def server_now(url: str):
    """The PostgreSQL server's clock (what pg_stat_user_tables' times are read against)."""
    return rows(url, "SELECT clock_timestamp() AS now")[0]["now"]


def tables_not_analyzed_since(url: str, since) -> list[str]:
    """The tables of the URL's schema that no ANALYZE command has sampled since `since`
    (autovacuum's own analyses do not count: the test server runs without it)."""
    return [row["relname"] for row in rows(
        url, "SELECT relname FROM pg_stat_user_tables WHERE schemaname = current_schema()"
             " AND (last_analyze IS NULL OR last_analyze < ?) ORDER BY relname", (since,))]
