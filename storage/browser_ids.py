"""Browser visitor ids as stored: the secret key, the id a browser id stands for, and
links from a day's ip+ua visitor id to a browser's (enrichment/browser_ids.py uses them
in the flush; storage/payments.py for customer.visitor_id).
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections.abc import Callable, Iterable

import orjson

from storage.db import Database
from storage.statements import statement
from vocabulary import DAY_SHIFT, day_bits

KEY_BYTES = 32
_BROWSER_ID = re.compile(r"(?:[0-9a-f]{4}\.)?[0-9a-f]{32}")
UNDATED_CHARS = 32
# BLAKE2b personalisations: never equal to a daily hash's, nor to each other's.
_PERSON = b"tally.browser.id"
_DATED_PERSON = b"tally.browser.dt"


_BROWSER_ID_KEY = statement("SELECT key FROM browser_id_key WHERE id = 1")
_INSERT_KEY = statement(
    "INSERT OR IGNORE INTO browser_id_key (id, key, created_at) VALUES (1, ?, ?)")
_SITE_HAS_LINKS = statement("SELECT 1 FROM browser_links WHERE site_id = ? LIMIT 1")
_LINKED_VISITORS = statement(
    "SELECT l.daily_visitor_id, l.visitor_id FROM json_each(?) AS w"
    " CROSS JOIN browser_links l WHERE l.site_id = ? AND l.daily_visitor_id = w.value")
_WRITE_LINKS = statement(
    "INSERT INTO browser_links (site_id, daily_visitor_id, visitor_id, day, seen_at)"
    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (site_id, daily_visitor_id) DO UPDATE SET"
    " visitor_id = excluded.visitor_id, seen_at = excluded.seen_at"
    " WHERE excluded.seen_at >= browser_links.seen_at")
_PRUNE_LINKS = statement("DELETE FROM browser_links WHERE day < ?")


def is_browser_id(value: object) -> bool:
    """What the script's tally_vid cookie holds: `dddd.` and 32 lower-case hex digits (128
    random bits), dddd the UTC day it was made (days since 1970, 4 hex digits), or the 32
    digits alone, as cookies the script wrote before it dated them keep."""
    return type(value) is str and _BROWSER_ID.fullmatch(value) is not None


def browser_visitor_id(key: bytes, site_id: int, browser_id: str) -> int:
    """The signed 64-bit visitor id a browser id is stored under on a site: of the dated
    shape, a dated id of the cookie's day (vocabulary.day_bits over a 48-bit keyed hash,
    so a day's new browsers fall in one range of the visitor index); of the undated one,
    a 64-bit keyed hash, as ever (every existing cookie keeps its visitor)."""
    data = site_id.to_bytes(8, "big", signed=True) + browser_id.encode()
    hashers = _hashers.get(key)
    if hashers is None:
        hashers = _keyed(key)
    if len(browser_id) == UNDATED_CHARS:
        blake = hashers[0].copy()
        blake.update(data)
        return int.from_bytes(blake.digest(), "big", signed=True)
    blake = hashers[1].copy()
    blake.update(data)
    return day_bits(int(browser_id[:4], 16)) | int.from_bytes(blake.digest(), "big")


# key -> (undated, dated) BLAKE2b keyed and personalised, nothing hashed yet: a copy of one
# then hashes an id with the same result as a keyed BLAKE2b made for it, in half its time
# (a keyed BLAKE2b compresses its key's block when made). An installation has one key.
_hashers: dict[bytes, tuple] = {}


def _keyed(key: bytes) -> tuple:
    if len(_hashers) >= 4:
        _hashers.clear()
    hashers = _hashers[key] = (
        hashlib.blake2b(key=key, digest_size=8, person=_PERSON),
        hashlib.blake2b(key=key, digest_size=DAY_SHIFT // 8, person=_DATED_PERSON))
    return hashers


def browser_id_key(conn: sqlite3.Connection, random_bytes: Callable[[int], bytes], now_ms: int,
                   db: Database | None = None) -> bytes:
    """The installation's key, made from `random_bytes` when none exists (the first writer
    wins). Outside a transaction it writes in one of `db`'s."""
    row = conn.execute(_BROWSER_ID_KEY).fetchone()
    if row is None:
        if conn.in_transaction or db is None:
            _insert_key(conn, random_bytes(KEY_BYTES), now_ms)
        else:
            with db.transaction(conn):
                _insert_key(conn, random_bytes(KEY_BYTES), now_ms)
        row = conn.execute(_BROWSER_ID_KEY).fetchone()
    return row[0]


def _insert_key(conn: sqlite3.Connection, key: bytes, now_ms: int) -> None:
    conn.execute(_INSERT_KEY,
                 (key, now_ms))


def site_has_links(conn: sqlite3.Connection, site_id: int) -> bool:
    return conn.execute(_SITE_HAS_LINKS,
                        (site_id,)).fetchone() is not None


def linked_visitors(conn: sqlite3.Connection, site_id: int,
                    daily_ids: Iterable[int]) -> dict[int, int]:
    """daily ip+ua visitor id -> browser visitor id, for those of `daily_ids` linked."""
    return dict(conn.execute(
        _LINKED_VISITORS,
        (orjson.dumps(list(daily_ids)), site_id)))


def write_links(conn: sqlite3.Connection, links: Iterable[tuple[int, int, int, int, int]]) -> None:
    """(site id, daily visitor id, browser visitor id, day, seen at): the latest seen wins."""
    conn.executemany(
        _WRITE_LINKS, links)


def prune_links(conn: sqlite3.Connection, before_day: int) -> None:
    conn.execute(_PRUNE_LINKS, (before_day,))
