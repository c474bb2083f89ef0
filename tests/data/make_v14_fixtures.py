"""Builds tests/data/tally-v14/, the fixtures of the release before schema version 15 (main
at commit d739043, `PRAGMA user_version = 14`): the same twelve days of a shop on SQLite
(tally-v14.db) and on PostgreSQL (tally-v14.pgdump, that release's `tally backup`), and
the reports that release gave over them (reports-sqlite.json, reports-postgres.json).

The world holds stored final days (reports over past days stored their figures, so
traffic_day_dimensions has rows in version 14's column order, the layout SQLite 3.40's
quick_check misread), pageviews from four kinds of visitors, custom events with
properties, an $identify, payments through the API (a customer, a subscription, a
refund), a Stripe checkout with a subscription, a charge, an invoice and a refund, a
dashboard user and a shared link. tests/test_long_life.py opens both under the current
release and compares every report with what this release answered.

Run from a checkout of that commit, with its venv, and a PostgreSQL for the archive:
    git -C /work/main worktree add /tmp/tally-v14 d739043 && cd /tmp/tally-v14 && make install
    .venv/bin/python /path/to/tests/data/make_v14_fixtures.py /path/to/tests/data/tally-v14
It uses only that release's `tally` command and its HTTP service under gunicorn, as a
user of that release would; only the clock is the script's (a module that serves that
release's `app.create_app` with a clock read from a file, so the world spans days). The
files are checked in as built; this script documents how, it is not run by tests.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

RELEASE = Path.cwd()  # the checkout of the previous release
BIN = Path(sys.executable).parent
sys.path.insert(0, str(RELEASE))
from tests.stripe_events import (  # noqa: E402 - the release's own copy, from its checkout
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

POSTGRES = os.environ.get("TALLY_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = "tally_v14"
START = unix("2026-09-01T09:00:00Z")
NOW = unix("2026-09-12T15:00:00Z")  # when the reports are asked for
FIRST, LAST = "2026-09-01", "2026-09-12"
EMAIL, PASSWORD = "owner@shop.example", "a long enough password"
CLOCKED_APP = '''
import os
from app import create_app
from config import Config

def clock():
    with open(os.environ["TEST_CLOCK_FILE"]) as handle:
        return float(handle.read())

app = create_app(Config.from_env(), clock=clock)
'''
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
}


def report_paths() -> list[str]:
    period = f"from={FIRST}&to={LAST}"
    paths = [f"/api/v1/stats/aggregate?{period}",
             f"/api/v1/stats/aggregate?{period}&compare=previous_period",
             f"/api/v1/stats/aggregate?{period}&goal=Signup",
             f"/api/v1/stats/goals?{period}", "/api/v1/stats/realtime",
             f"/api/v1/stats/mrr?at={LAST}", "/api/v1/stats/mrr?at=2026-09-05",
             f"/api/v1/stats/mrr/movements?{period}"]
    paths += [f"/api/v1/stats/breakdown?{period}&by={by}" for by in (
        "channel", "source", "page", "entry_page", "country", "device", "browser", "os", "event")]
    paths += [f"/api/v1/stats/revenue?{period}&by={by}" for by in (
        "channel", "source", "campaign", "landing_page", "country", "device", "plan")]
    paths += [f"/api/v1/stats/timeseries?{period}&interval={interval}"
              for interval in ("day", "week", "month")]
    paths += [f"/api/v1/stats/timeseries?from=2026-09-10&to={LAST}&interval=hour",
              f"/api/v1/stats/breakdown?{period}&by=page&filters=visit%3Achannel%3D%3DOrganic%20Search",
              f"/api/v1/stats/timeseries?{period}&interval=day&filters=event%3Apage~%2Fpricing",
              f"/api/v1/stats/revenue?{period}&filters=visit%3Adevice%21%3Dmobile",
              f"/api/v1/stats/breakdown?{period}&by=source&format=csv",
              f"/api/v1/stats/revenue?{period}&by=plan&format=csv",
              f"/api/v1/stats/timeseries?from=2026-09-10&to={LAST}&interval=hour&format=csv"]
    return paths


class Release:
    """The previous release's command and service on one database."""

    def __init__(self, env: dict, folder: Path):
        self.env = {**{k: v for k, v in os.environ.items()
                       if k not in ("TALLY_DB", "TALLY_DATABASE_URL")}, **env}
        self.folder = folder
        self.clock = folder / "clock"
        self.set_clock(START)
        (folder / "v14_clocked_app.py").write_text(CLOCKED_APP)
        self.server = None
        self.base = ""

    def set_clock(self, when: float) -> None:
        partial = self.clock.with_name("clock.partial")
        partial.write_text(repr(float(when)))
        os.replace(partial, self.clock)

    def tally(self, *args: str, stdin: str = "") -> dict:
        out = subprocess.run([str(BIN / "tally"), *args, "--json"], check=True, text=True,
                             capture_output=True, env=self.env, cwd=RELEASE, input=stdin)
        return json.loads(out.stdout)

    def start(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {**self.env, "TEST_CLOCK_FILE": str(self.clock), "TALLY_FLUSH_INTERVAL": "0.2",
               "PYTHONPATH": str(self.folder)}
        self.server = subprocess.Popen(
            [str(BIN / "gunicorn"), "--bind", f"127.0.0.1:{port}", "--workers", "1",
             "v14_clocked_app:app"], env=env, cwd=RELEASE)
        self.base = f"http://127.0.0.1:{port}"
        for _ in range(150):
            try:
                urllib.request.urlopen(self.base + "/healthz", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        raise SystemExit("the previous release did not start")

    def stop(self) -> None:
        self.server.send_signal(signal.SIGTERM)  # the worker flushes its queue on the way out
        assert self.server.wait(60) == 0

    def request(self, path: str, body: bytes | None = None, headers: dict | None = None):
        req = urllib.request.Request(self.base + path, body, headers=headers or {},
                                     method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()


def build(release: Release) -> tuple[dict, dict]:
    """The world, then the reports: (what the test needs to know, reports by request)."""
    account = release.tally("account", "create", "--name", "Upgrade Shop", "--plan", "growth")
    site = release.tally("site", "create", "--account", account["id"], "--host", "shop.example")
    key = release.tally("key", "create", "--site", site["id"], "--scope", "events", "--scope",
                        "payments", "--scope", "read")["key"]
    release.tally("user", "create", "--email", EMAIL, "--account", account["id"],
                  "--password-stdin", stdin=PASSWORD + "\n")
    share = release.tally("share", "create", "--site", site["id"], "--revenue")["url"]
    release.tally("stripe", "set-secret", "--site", site["id"], stdin=SECRET + "\n")
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    release.start()

    def at(day: int, hour: int, minute: int = 0) -> None:
        release.set_clock(START + day * 86_400 + (hour - 9) * 3600 + minute * 60)

    def events(*items: tuple[str, str, str, dict]) -> None:
        batch = []
        for visitor, name, path, extra in items:
            who = VISITORS[visitor]
            event = {"e": name, "u": f"https://shop.example{path}", "ip": who["ip"], "ua": who["ua"]}
            if name == "pageview" and who.get("r") and "utm_" not in path:
                event["r"] = who["r"]
            batch.append({**event, **extra})
        status, body = release.request("/api/v1/events", json.dumps(
            {"s": site["id"], "b": batch}).encode(), auth)
        assert status == 204, body

    def pay(body: dict) -> None:
        status, answer = release.request("/api/v1/payments", json.dumps(body).encode(), auth)
        assert status == 200, answer

    def stripe(event_type: str, obj: dict, when: str) -> None:
        payload = json.dumps(stripe_event(event_type, obj, created=unix(when))).encode()
        status, answer = release.request(
            f"/api/v1/integrations/stripe/{site['id']}", payload,
            {"Stripe-Signature": sign(payload), "Content-Type": "application/json"})
        assert status == 200, answer

    for day in range(11):
        at(day, 9)
        events(("direct", "pageview", "/docs", {"t": "Docs"}))
        if day % 2 == 0:
            at(day, 10)
            events(("google", "pageview", "/", {"t": "Home"}))
            at(day, 10, 3)
            events(("google", "pageview", "/pricing", {}),
                   ("google", "Signup", "/pricing", {"p": {"plan": "pro" if day % 4 == 0 else "team"}}))
        if day in (1, 4, 8):
            at(day, 13)
            events(("news", "pageview", "/?utm_source=newsletter&utm_medium=email"
                                        "&utm_campaign=autumn", {}))
            at(day, 13, 4)
            events(("news", "pageview", "/blog/launch", {"t": "Launch"}))
        if day in (3, 9):
            at(day, 16)
            events(("bing", "pageview", "/pricing", {}), ("bing", "Download", "/pricing",
                                                          {"p": {"file": "price-list.pdf"}}))
        if day == 2:
            at(day, 10, 5)
            events(("google", "$identify", "/account", {"uid": "user-ada"}))
            paid = datetime.fromtimestamp(release_now(release), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            pay({"payment_id": "pay_ada_1", "amount": 49, "currency": "EUR", "fee": 1.72,
                 "kind": "charge", "paid_at": paid,
                 "customer": {"id": "cus_ada", "email": "ada@example.com", "user_id": "user-ada",
                              "name": "Ada L", "country": "GB"},
                 "subscription": {"id": "sub_ada", "plan": "Pro", "interval": "month",
                                  "amount": 49}})
        if day == 5:
            at(day, 11)
            pay({"payment_id": "pay_bob_1", "amount": 120, "currency": "EUR", "kind": "charge",
                 "paid_at": "2026-09-06T11:00:00Z", "customer": {"id": "cus_bob", "country": "DE"},
                 "metadata": {"order": "B-1"}})
        if day == 6:
            at(day, 14)
            checkout = stripe_object("checkout.session", customer="cus_stripe", mode="subscription",
                                     subscription="sub_stripe", payment_intent=None,
                                     created=unix("2026-09-07T14:00:00Z"),
                                     metadata={"tally_user_id": "user-ada"})
            stripe("checkout.session.completed", checkout, "2026-09-07T14:00:00Z")
            basic = price("price_basic", 2500, product="prod_basic", nickname="Basic")
            stripe("customer.subscription.created",
                   subscription("sub_stripe", "cus_stripe", [(basic, 1)], status="active",
                                start="2026-09-07T14:00:00Z"), "2026-09-07T14:00:00Z")
            stripe("charge.succeeded", charge("ch_v14_1", 2500, customer="cus_stripe",
                                              created="2026-09-07T14:01:00Z"), "2026-09-07T14:01:00Z")
            stripe("invoice.paid", invoice("in_v14_1", "sub_stripe", "cus_stripe",
                                           charge_id="ch_v14_1", paid="2026-09-07T14:01:00Z",
                                           lines=[invoice_line("sub_stripe", 2500,
                                                               start="2026-09-07", end="2026-10-07",
                                                               product="prod_basic")]),
                   "2026-09-07T14:01:00Z")
        if day == 9:
            at(day, 12)
            pay({"payment_id": "pay_ada_refund", "amount": 10, "currency": "EUR", "kind": "refund",
                 "paid_at": "2026-09-10T12:00:00Z", "customer": {"id": "cus_ada"}})
            stripe("refund.created", refund("re_v14_1", "ch_v14_1", 500, created="2026-09-10T12:05:00Z"),
                   "2026-09-10T12:05:00Z")
    at(11, 14)
    events(("direct", "pageview", "/docs", {}), ("google", "pageview", "/", {}))
    # A restart stores every event still queued, so the reports count them all (a day is
    # final a day after it ends: its figures are stored once and never counted again).
    release.stop()
    release.set_clock(NOW)
    release.start()
    reports = {}
    for path in report_paths():
        status, body = release.request(path, headers={"Authorization": f"Bearer {key}"})
        assert status == 200, (path, body)
        reports[path] = body.decode() if "format=csv" in path else json.loads(body)["data"]
    # The same days through the command (stores them too, as an operator's reports would).
    reports["tally report traffic --by page"] = release.tally(
        "report", "traffic", "--site", site["id"], "--from", FIRST, "--to", "2026-09-10",
        "--by", "page")
    release.stop()
    world = {"site": site["id"], "account": account["id"], "key": key, "share": share,
             "email": EMAIL, "password": PASSWORD, "now": NOW, "first": FIRST, "last": LAST}
    return world, reports


def release_now(release: Release) -> float:
    return float(release.clock.read_text())


def main(out: str) -> None:
    folder = Path(out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tally-v14-"))

    db = work / "tally-v14.db"
    world, reports = build(Release({"TALLY_DB": str(db)}, work))
    conn = sqlite3.connect(db)
    quick = conn.execute("PRAGMA quick_check").fetchall()  # version 14's flaw, on SQLite 3.40
    layout = [row[1] for row in conn.execute("PRAGMA table_info(traffic_day_dimensions)")]
    assert conn.execute("SELECT count(*) FROM traffic_day_dimensions").fetchone()[0] > 0
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.execute("VACUUM")
    conn.close()
    shutil.copyfile(db, folder / "tally-v14.db")
    (folder / "reports-sqlite.json").write_text(json.dumps(reports, indent=1, sort_keys=True) + "\n")

    import psycopg

    admin = psycopg.connect(POSTGRES, autocommit=True)
    admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    admin.execute(f"CREATE SCHEMA {SCHEMA}")
    url = f"{POSTGRES}?options=-csearch_path%3D{SCHEMA}"
    pg_work = work / "pg"
    pg_work.mkdir()
    release = Release({"TALLY_DATABASE_URL": url}, pg_work)
    pg_world, pg_reports = build(release)
    archive = folder / "tally-v14.pgdump"
    archive.unlink(missing_ok=True)
    backup = release.tally("backup", str(archive))
    assert backup["integrity"] == "ok" and backup["user_version"] == 14
    admin.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    admin.close()
    (folder / "reports-postgres.json").write_text(
        json.dumps(pg_reports, indent=1, sort_keys=True) + "\n")
    world["postgres"] = {"schema": SCHEMA, "site": pg_world["site"], "key": pg_world["key"],
                         "share": pg_world["share"], "account": pg_world["account"]}
    world["sqlite"] = {"quick_check": [row[0] for row in quick][:3],
                       "traffic_day_dimensions": layout}
    world["built_by"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                       text=True, cwd=RELEASE).stdout.strip()
    (folder / "world.json").write_text(json.dumps(world, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(work)
    print(json.dumps({"folder": str(folder), "site": world["site"]}))


if __name__ == "__main__":
    main(sys.argv[1])
