"""A large, realistic site written straight through storage, for the read-abuse bench.

`fill(db, site_id, events, days, end_ms)` writes `events` events and their sessions over
`days` days ending at `end_ms`, in a few seconds: rows are built here and inserted with
storage's own statements (storage.events.insert_events, storage.sessions.insert_sessions:
executemany on SQLite, COPY on PostgreSQL), not through the flush, which would take
minutes for a million events. Deterministic for a seed.

Sessions hold 1 to 9 events within 30 minutes; pages follow a long tail (a few hundred
paths, a handful take most views); sources and channels as a content site sees them;
one event in ten is a custom event, some with properties.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import orjson

from storage.events import EventRow
from storage.sessions import insert_sessions
from vocabulary import DAY_MS

HOST = "example.com"
SECTIONS = ("blog", "docs", "guides", "changelog", "customers", "features", "integrations")
TOP_PAGES = ("/", "/pricing", "/signup", "/login", "/about", "/contact", "/features")
# (source, channel, referrer, utm medium)
SOURCES = (
    (None, "Direct", None, None),
    ("Google", "Organic Search", "https://www.google.com/", None),
    ("Bing", "Organic Search", "https://www.bing.com/", None),
    ("DuckDuckGo", "Organic Search", "https://duckduckgo.com/", None),
    ("Twitter", "Organic Social", "https://t.co/abc", None),
    ("Facebook", "Organic Social", "https://www.facebook.com/", None),
    ("LinkedIn", "Organic Social", "https://www.linkedin.com/", None),
    ("Reddit", "Organic Social", "https://www.reddit.com/", None),
    ("Hacker News", "Referral", "https://news.ycombinator.com/", None),
    ("GitHub", "Referral", "https://github.com/", None),
    ("newsletter", "Email", None, "email"),
    ("google", "Paid Search", "https://www.google.com/", "cpc"),
)
SOURCE_WEIGHTS = (30, 30, 5, 3, 6, 4, 3, 4, 3, 3, 6, 3)
COUNTRIES = ("US", "DE", "GB", "FR", "IN", "CA", "NL", "BR", "ES", "IT", "SE", "PL", "JP",
             "AU", "CH", "AT", "BE", "DK", "NO", "FI", "IE", "PT", "CZ", "RO", "MX", None)
BROWSERS = ("Chrome", "Safari", "Firefox", "Edge", "Samsung Internet", "Opera")
OSES = ("Windows", "macOS", "iOS", "Android", "Linux")
DEVICES = ("desktop", "mobile", "tablet")
CUSTOM = (("signup", {"plan": "pro"}), ("signup", {"plan": "free"}), ("download", None),
          ("cta click", {"position": "hero"}), ("purchase", {"plan": "team"}))


def pages(count: int = 400) -> list[str]:
    """`count` distinct pathnames: the top pages, then sections' articles."""
    paths = list(TOP_PAGES)
    n = 0
    while len(paths) < count:
        section = SECTIONS[n % len(SECTIONS)]
        paths.append(f"/{section}/article-{n // len(SECTIONS)}-on-topic-{n % 13}")
        n += 1
    return paths


def sessions_and_events(site_id: int, events: int, start_ms: int, end_ms: int,
                        first_session_id: int, seed: int = 26) -> Iterator[tuple[tuple, list]]:
    """(session row in NEW_SESSION_COLUMNS order, [(EventRow, session id)]) until `events`
    events are made, with session starts spread evenly over [start_ms, end_ms)."""
    rnd = random.Random(seed)
    paths = pages()
    path_weights = [1.0 / (rank + 1) ** 0.9 for rank in range(len(paths))]
    mean_events = 4.5
    sessions = max(1, int(events / mean_events))
    step = (end_ms - start_ms - 30 * 60_000) / sessions
    made, session_id = 0, first_session_id
    visitors = [rnd.getrandbits(63) for _ in range(max(1, sessions // 3))]
    while made < events:
        started = min(int(start_ms + (session_id - first_session_id) * step),
                      end_ms - 30 * 60_000)
        visitor = rnd.choice(visitors) + started // DAY_MS  # a visitor id lives one day
        source, channel, referrer, medium = rnd.choices(SOURCES, SOURCE_WEIGHTS)[0]
        country, browser = rnd.choice(COUNTRIES), rnd.choice(BROWSERS)
        os_name, device = rnd.choice(OSES), rnd.choice(DEVICES)
        count = min(rnd.randint(1, 8), events - made)
        trail = rnd.choices(paths, path_weights, k=count)
        campaign = f"launch-{session_id % 5}" if medium else None
        rows, ts, pageviews, custom = [], started, 0, 0
        for n, path in enumerate(trail):
            name, props = "pageview", None
            if n and rnd.random() < 0.12:
                name, props = rnd.choice(CUSTOM)
            pageviews += name == "pageview"
            custom += name != "pageview"
            query = f"?utm_source={source}&utm_medium={medium}&utm_campaign={campaign}" \
                if n == 0 and medium else ""
            rows.append((EventRow(
                site_id, ts, name, visitor, path, f"https://{HOST}{path}{query}", HOST,
                referrer if n == 0 else None,
                referrer.split("/")[2] if referrer and n == 0 else None,
                None, None, None, None, props and orjson.dumps(props).decode(), country,
                browser, os_name, device,
                source if n == 0 and medium else None, medium if n == 0 else None,
                campaign if n == 0 else None, None, None, None, None, None, None, None, None),
                session_id))
            ts += rnd.randint(5_000, 240_000)
        last = rows[-1][0].ts
        session = (session_id, site_id, visitor, started, last, channel, source, referrer,
                   f"https://{HOST}{trail[0]}", trail[0], source if medium else None, medium,
                   campaign, None, None, pageviews, custom)
        yield session, rows
        made += count
        session_id += 1


def fill(db, site_id: int, events: int, days: int, end_ms: int, seed: int = 26,
         batch_events: int = 50_000) -> dict:
    """Write the events and sessions (a transaction per `batch_events` events)."""
    from storage.events import insert_events
    from storage.sessions import next_session_id

    conn = db.conn()
    first_id = next_session_id(conn)
    stream = sessions_and_events(site_id, events, end_ms - days * DAY_MS, end_ms, first_id, seed)
    stored = sessions_made = 0
    done = False
    while not done:
        session_rows, event_rows = [], []
        for session, rows in stream:
            session_rows.append(session)
            event_rows.extend(rows)
            if len(event_rows) >= batch_events:
                break
        else:
            done = True
        if not event_rows:
            break
        event_rows.sort(key=lambda row: row[0].ts)
        with db.transaction() as conn:
            insert_sessions(conn, session_rows)
            insert_events(conn, [row for row, _ in event_rows], [sid for _, sid in event_rows])
        stored += len(event_rows)
        sessions_made += len(session_rows)
    if db.dialect == "postgres":  # as autovacuum would after a bulk load (the test server has none)
        db.conn().raw.execute("ANALYZE events")
        db.conn().raw.execute("ANALYZE sessions")
    return {"events": stored, "sessions": sessions_made}
