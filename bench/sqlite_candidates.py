"""Raw SQLite insert rates of candidate events-table shapes (for docs/perf-notes.md).

Not part of `make bench`: it compares schemas that do not exist in schema.sql yet, so the
events table can be designed from figures. Same pragmas as storage/db.py (WAL, foreign
keys, synchronous FULL unless told otherwise), one executemany per transaction.

    .venv/bin/python -m bench.sqlite_candidates            # the table in perf-notes
    .venv/bin/python -m bench.sqlite_candidates --growth   # rate as the table grows
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sqlite3
import tempfile
import time
from pathlib import Path

# Text columns as a naive flush would write them: ~400 bytes of payload a row.
WIDE = """
CREATE TABLE events (
    id INTEGER PRIMARY KEY, site_id INTEGER NOT NULL, ts INTEGER NOT NULL,
    name TEXT NOT NULL, url TEXT NOT NULL, pathname TEXT NOT NULL, referrer TEXT,
    referrer_host TEXT, title TEXT, width INTEGER, language TEXT, uid TEXT, props TEXT,
    visitor_id BLOB, country TEXT, browser TEXT, os TEXT, device TEXT,
    utm_source TEXT, utm_medium TEXT, utm_campaign TEXT, utm_term TEXT, utm_content TEXT,
    gclid TEXT, msclkid TEXT, fbclid TEXT)
"""
# Repeated strings dictionary-encoded to small integers, no full URL/title: ~40 bytes a row.
LEAN = """
CREATE TABLE events (
    id INTEGER PRIMARY KEY, site_id INTEGER NOT NULL, ts INTEGER NOT NULL,
    name_id INTEGER NOT NULL, path_id INTEGER NOT NULL, referrer_id INTEGER,
    visitor_id INTEGER, country TEXT, ua_id INTEGER, campaign_id INTEGER, props TEXT)
"""
INDEXES = {
    0: [],
    1: ["CREATE INDEX events_site_ts ON events (site_id, ts)"],
    2: ["CREATE INDEX events_site_ts ON events (site_id, ts)",
        "CREATE INDEX events_site_visitor ON events (site_id, visitor_id, ts)"],
}
VISITORS = 50_000
PAGES = ["/", "/pricing", "/blog/how-we-cut-our-cloud-bill-in-half", "/docs/getting-started",
         "/docs/api/events", "/signup", "/features/attribution", "/blog/mrr-explained"]
REFERRERS = [None, None, "https://www.google.com/", "https://news.ycombinator.com/item?id=41234567",
             "https://t.co/xYz12AbC", "https://duckduckgo.com/"]
UAS = [("Chrome", "Windows", "desktop"), ("Safari", "iOS", "mobile"),
       ("Firefox", "Linux", "desktop"), ("Chrome Mobile", "Android", "mobile")]


def wide_rows(n: int, start_ms: int, seed: int = 1) -> list[tuple]:
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        page = rnd.choice(PAGES)
        browser, os_name, device = rnd.choice(UAS)
        visitor = hashlib.blake2b(rnd.randrange(VISITORS).to_bytes(4, "big"), digest_size=8).digest()
        campaign = i % 5 == 0
        rows.append((
            1, start_ms + i, "pageview",
            f"https://www.example.com{page}?utm_source=newsletter&utm_medium=email" if campaign
            else f"https://www.example.com{page}",
            page, rnd.choice(REFERRERS), "www.google.com", "How we cut our cloud bill in half | Example",
            1440, "en-US", None, None, visitor, "DE", browser, os_name, device,
            "newsletter" if campaign else None, "email" if campaign else None,
            "spring-launch" if campaign else None, None, None, None, None, None,
        ))
    return rows


def lean_rows(n: int, start_ms: int, seed: int = 1) -> list[tuple]:
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        visitor = int.from_bytes(hashlib.blake2b(rnd.randrange(VISITORS).to_bytes(4, "big"),
                                                 digest_size=8).digest(), "big", signed=True)
        rows.append((1, start_ms + i, 1, rnd.randrange(len(PAGES)), rnd.randrange(6) or None,
                     visitor, "DE", rnd.randrange(len(UAS)), 1 if i % 5 == 0 else None, None))
    return rows


SHAPES = {
    "wide": (WIDE, wide_rows, 25),
    "lean": (LEAN, lean_rows, 10),
}


def connect(path: str, synchronous: str, cache_kib: int | None) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")  # sql-safe: FULL or NORMAL, from code
    conn.execute("PRAGMA foreign_keys = ON")
    if cache_kib:
        conn.execute(f"PRAGMA cache_size = {-int(cache_kib)}")  # sql-safe: an int
    return conn


def insert_rate(shape: str, indexes: int, rows: int, txn: int, synchronous: str = "FULL",
                cache_kib: int | None = None, chunks: int = 1) -> dict:
    """Insert `rows` rows `chunks` times; rows/s of each chunk (the table grows between)."""
    ddl, make_rows, ncols = SHAPES[shape]
    placeholders = ", ".join("?" * ncols)
    sql = f"INSERT INTO events VALUES (NULL, {placeholders})"  # noqa: S608 - placeholders only
    with tempfile.TemporaryDirectory(prefix="tally-sqlite-") as folder:
        path = os.path.join(folder, "events.db")
        conn = connect(path, synchronous, cache_kib)
        conn.execute(ddl)
        for statement in INDEXES[indexes]:
            conn.execute(statement)
        data = make_rows(rows, 1_790_000_000_000)
        rates = []
        for _ in range(chunks):
            started = time.perf_counter()
            for i in range(0, rows, txn):
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(sql, data[i:i + txn])
                conn.execute("COMMIT")
            rates.append(rows / (time.perf_counter() - started))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = Path(path).stat().st_size
        total = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        conn.close()
    return {"shape": shape, "indexes": indexes, "txn": txn, "synchronous": synchronous,
            "cache_kib": cache_kib, "rows": total, "rows_per_s": [round(r) for r in rates],
            "bytes_per_row": round(size / total)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--growth", action="store_true", help="rate per 250k rows up to 2M")
    args = parser.parse_args(argv)
    if args.growth:
        for shape in ("wide", "lean"):
            for cache in (None, 65_536):
                print(insert_rate(shape, 2, 250_000, 10_000, cache_kib=cache, chunks=8))
        return
    for shape in ("wide", "lean"):
        for indexes in (0, 1, 2):
            print(insert_rate(shape, indexes, args.rows, 10_000))
    for txn in (500, 2_000, 50_000):
        print(insert_rate("wide", 2, args.rows, txn))
    print(insert_rate("wide", 2, args.rows, 10_000, synchronous="NORMAL"))


if __name__ == "__main__":
    main()
