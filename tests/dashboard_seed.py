"""A seeded world for the dashboard tests: two accounts, a site each, a user each, traffic on
several channels with a custom event, and paying customers, written through the real
HTTP API (events, $identify, payments) and flushed."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import webtest

from app import create_app
from config import Config
from tests.conftest import WAIT, FakeClock, bearer, cli_json, run_cli

PASSWORD = "correct horse battery staple"
UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
UA_PHONE = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
            "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1")
# (ip, user agent, landing URL, referrer, customer's user id or None)
VISITS = (
    ("203.0.113.1", UA, "https://shop.test/", "https://www.google.com/", "u-1"),
    ("203.0.113.2", UA, "https://shop.test/pricing", "https://www.google.com/", None),
    ("203.0.113.3", UA_PHONE, "https://shop.test/", "https://t.co/abc", "u-2"),
    ("203.0.113.4", UA, "https://shop.test/?utm_source=newsletter&utm_medium=email"
                        "&utm_campaign=autumn", None, "u-3"),
    ("203.0.113.5", UA, "https://shop.test/blog", None, None),
    ("203.0.113.6", UA_PHONE, "https://shop.test/pricing", None, None),
)


def users(db: str) -> dict:
    """Accounts, sites, users and keys, made with the real CLI."""
    world = {}
    for name, host in (("a", "shop.test"), ("b", "other.test")):
        account = cli_json("account", "create", "--name", f"Account {name.upper()}",
                           "--plan", "growth", db=db)
        site = cli_json("site", "create", "--account", account["id"], "--host", host, db=db)
        key = cli_json("key", "create", "--site", site["id"], "--scope", "events",
                       "--scope", "payments", "--scope", "read", db=db)
        world[name] = {"account": account["id"], "site": site["id"], "key": key["key"],
                       "host": host, "email": f"owner-{name}@example.com"}
    for name in ("a", "b"):
        _create_user(db, world[name]["email"], world[name]["account"])
    return world


def _create_user(db: str, email: str, account: str) -> None:
    run_cli("user", "create", "--email", email, "--account", account, "--password-stdin",
            db=db, input_text=PASSWORD + "\n")


def traffic(tally, site: dict, now: float, advance=None) -> None:
    """The visits above, a signup event, identifies and payments, all flushed."""
    client = webtest.TestApp(tally)
    headers = bearer(site["key"])
    sid = site["site"]

    def send(event):
        client.post("/api/v1/events", orjson.dumps(event),
                    headers={**headers, "Content-Type": "application/json"}, status=204)
        if advance:
            advance(30)

    for ip, ua, url, referrer, user_id in VISITS:
        event = {"s": sid, "e": "pageview", "u": url, "ip": ip, "ua": ua}
        if referrer:
            event["r"] = referrer
        send(event)
        send({"s": sid, "e": "pageview", "u": "https://shop.test/features", "ip": ip, "ua": ua})
        if user_id:
            send({"s": sid, "e": "signup", "u": "https://shop.test/signup", "ip": ip, "ua": ua})
            send({"s": sid, "e": "$identify", "u": "https://shop.test/account", "uid": user_id,
                  "ip": ip, "ua": ua})
    assert tally.flusher.flush_now(timeout=WAIT)
    paid_at = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for n, (user_id, amount) in enumerate((("u-1", 49), ("u-2", 19), ("u-3", 99)), start=1):
        payment = {"payment_id": f"pay_{n}", "amount": amount, "currency": "EUR",
                   "kind": "charge", "paid_at": paid_at,
                   "customer": {"id": f"cus_{n}", "user_id": user_id},
                   "subscription": {"id": f"sub_{n}", "plan": "pro" if amount > 40 else "basic",
                                    "interval": "month", "amount": amount,
                                    "status": "active", "started_at": paid_at}}
        client.post("/api/v1/payments", orjson.dumps(payment),
                    headers={**headers, "Content-Type": "application/json"}, status=200)


def world(db: str) -> tuple[dict, float]:
    """(the accounts above, the clock's time after) for a new SQLite file `db`: users,
    sites and traffic on site a, as some weeks of a site owner's use leave them."""
    made = users(db)
    clock = FakeClock()
    tally = create_app(Config(db_path=db), clock=clock)
    traffic(tally, made["a"], clock(), clock.advance)
    tally.stop(timeout=5)
    return made, clock()
