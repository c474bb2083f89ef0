"""Request bodies for the benchmark: realistic events and payments, deterministic."""

from __future__ import annotations

import datetime as dt
import random

import orjson

SITE_HOSTS = ("example.com", "www.example.com")
BATCH_SIZE = 50
MAX_EVENT_BODY = 8_192

USER_AGENTS = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/126.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/17.5 Safari/605.1.15",
    "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/126.0.0.0 Mobile Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:127.0) Gecko/20100101 Firefox/127.0",
    "Mozilla/5.0 (iPad; CPU OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/17.5 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/126.0.0.0 Safari/537.36 Edg/126.0.0.0",
)
# Short ones keep a 50-event batch under 8 KiB, as real batching clients must.
LEAN_USER_AGENTS = (
    "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (Windows NT 10.0; rv:127.0) Gecko/20100101 Firefox/127.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14.5; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (Android 14; Mobile; rv:128.0) Gecko/128.0 Firefox/128.0",
)
PAGES = ("/", "/pricing", "/blog/how-we-cut-our-cloud-bill-in-half", "/docs/getting-started",
         "/docs/api/events", "/signup", "/features/attribution", "/blog/mrr-explained",
         "/customers/acme", "/changelog")
REFERRERS = ("https://www.google.com/", "https://news.ycombinator.com/",
             "https://duckduckgo.com/", "https://t.co/xYz12AbC", "https://www.bing.com/")


def _public_ipv4(rnd: random.Random) -> str:
    while True:
        a = rnd.randrange(1, 224)
        if a not in (10, 100, 127, 169, 172, 192, 198, 203):
            return f"{a}.{rnd.randrange(256)}.{rnd.randrange(256)}.{rnd.randrange(1, 255)}"


def single_event_bodies(site: str, count: int = 500, seed: int = 8) -> list[bytes]:
    """Realistic single pageviews of about 600 bytes, with ip and ua."""
    rnd = random.Random(seed)
    bodies = []
    for i in range(count):
        page = rnd.choice(PAGES)
        event = {
            "s": site, "e": "pageview",
            "u": f"https://www.example.com{page}?utm_source=newsletter&utm_medium=email"
                 f"&utm_campaign=spring-launch-{i % 7}",
            "r": rnd.choice(REFERRERS),
            "t": "How we cut our cloud bill in half, and what it taught us about caching, "
                 "queues and SQLite | Example Engineering Blog",
            "w": rnd.choice((390, 768, 1280, 1440, 1920)), "l": "en-US",
            "ip": _public_ipv4(rnd), "ua": rnd.choice(USER_AGENTS),
            "p": {"author": "jane-doe", "category": "engineering", "ab": f"variant-{i % 3}",
                  "plan": rnd.choice(("free", "starter", "growth")), "logged_in": i % 2 == 0},
        }
        bodies.append(orjson.dumps(event))
    return bodies


def collect_bodies(site: str, count: int = 500, seed: int = 13) -> list[bytes]:
    """What tally.js posts to /api/v1/collect: single events with a browser id `v`, no ip
    or ua (the connection and the User-Agent header give them)."""
    rnd = random.Random(seed)
    bodies = []
    for i in range(count):
        event = {
            "s": site, "e": "pageview" if i % 5 else "Signup",
            "u": f"https://www.example.com{rnd.choice(PAGES)}",
            "r": rnd.choice(REFERRERS), "t": "Example Engineering Blog",
            "w": rnd.choice((390, 768, 1280, 1440, 1920)), "l": "en-US",
            "v": f"{rnd.getrandbits(128):032x}",
        }
        bodies.append(orjson.dumps(event))
    return bodies


def batch_bodies(site: str, count: int = 200, seed: int = 50) -> list[bytes]:
    """50-event batches under 8 KiB: lean events of about 160 bytes with ip and ua."""
    rnd = random.Random(seed)
    pages = [page for page in PAGES if len(page) <= 24]
    bodies = []
    while len(bodies) < count:
        events = [{"e": "pageview", "u": f"https://example.com{rnd.choice(pages)}",
                   "ip": _public_ipv4(rnd), "ua": rnd.choice(LEAN_USER_AGENTS)}
                  for _ in range(BATCH_SIZE)]
        body = orjson.dumps({"s": site, "b": events})
        if len(body) <= MAX_EVENT_BODY:  # the rare longer draw is drawn again
            bodies.append(body)
    return bodies


def payment_bodies(count: int = 2_000, distinct: int = 1_000, seed: int = 3,
                   now: dt.datetime | None = None) -> list[bytes]:
    """Payments with customer and subscription over the 28 days before `now`; ids
    repeat, so past `distinct` they are updates. Customers carry `user_<k>` user ids
    (k < 400), which the flusher scenario's `$identify` events link to visitors; kinds,
    statuses, currencies and subscription intervals vary as the reports need."""
    rnd = random.Random(seed)
    now = (now or dt.datetime.now(dt.UTC)).replace(microsecond=0)
    bodies = []
    for i in range(count):
        n = i % distinct
        customer = n % 400
        amount = rnd.choice(("19", "49", "99.5", "249"))
        kind = "refund" if n % 17 == 0 else "chargeback" if n % 53 == 0 else "charge"
        paid = now - dt.timedelta(days=n % 28, minutes=1 + n % 60)
        payment = {
            "payment_id": f"pay_bench_{n:06d}",
            "customer": {"id": f"cus_{customer:05d}", "email": f"Buyer{customer}@Example.com",
                         "user_id": f"user_{customer}", "name": "Jane Doe", "country": "DE"},
            "amount": float(amount), "currency": ("EUR", "USD")[customer % 2],
            "fee": 1.25, "kind": kind, "paid_at": paid.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "status": "failed" if n % 29 == 0 else "succeeded",
            "metadata": {"invoice": f"in_{n:06d}"},
            "subscription": {"id": f"sub_{customer:05d}", "plan": ("pro", "team")[customer % 2],
                             "interval": ("month", "year", "week")[customer % 3],
                             "status": "canceled" if customer % 11 == 0 else "active",
                             "amount": float(amount), "started_at": "2026-01-01T00:00:00Z"},
        }
        bodies.append(orjson.dumps(payment))
    return bodies


