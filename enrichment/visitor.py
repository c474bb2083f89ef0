"""Visitor ids: a keyed hash of a secret daily salt, the site, the IP and the user agent.

Salts live in the `visitor_salts` table so every worker (and process) hashes the same
visitor to the same id on the same UTC day. Whoever first needs a day's salt creates it
with INSERT OR IGNORE (the first writer wins, everyone then reads the same row); salts
of days before yesterday are deleted, so none is kept longer than 48 hours. The raw IP
is never stored.

A dated salt (every salt made since schema version 25) gives ids that carry their day:
bit 63 clear, bits 48..62 `1 + day % 32767` (never 0, so no id is 0, the erased
visitor's), bits 0..47 a 48-bit keyed hash. One day's new visitors then fall in one range
of the (site_id, visitor_id) index, a few hundred leaves, instead of all over it. A salt
made before (not dated) keeps the signed 64-bit hash for the rest of its day, so a
visitor seen across the upgrade keeps one id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from storage.connection import Connection
from storage.db import Database
from storage.salts import Salt, delete_salts_before, insert_salt, read_salt
from vocabulary import DAY_MS, DAY_SHIFT, day_bits

SALT_BYTES = 32


def utc_day(ms: int) -> int:
    """Days since 1970-01-01 UTC."""
    return ms // DAY_MS


def visitor_id(salt: bytes, site_id: int, ip_packed: bytes, ua: str,
               day: int | None = None) -> int:
    """A signed 64-bit integer, the form the events table stores: under a dated salt of
    `day`, or an undated one when `day` is None."""
    return hashed_visitor_id(visitor_hasher(salt, site_id, day), ip_packed, ua)


def visitor_hasher(salt: bytes, site_id: int, day: int | None):
    """(BLAKE2b keyed with the day's salt and already fed the site, to copy per visitor;
    the id's day bits, None for an undated salt)."""
    site = site_id.to_bytes(8, "big", signed=True)
    if day is None:
        return hashlib.blake2b(site, key=salt, digest_size=8), None
    return hashlib.blake2b(site, key=salt, digest_size=DAY_SHIFT // 8), day_bits(day)


def salt_hasher(salt: Salt, day: int, site_id: int):
    """visitor_hasher() of a stored salt of `day`."""
    return visitor_hasher(salt.salt, site_id, day if salt.dated else None)


# The byte of each length, made once: the hash takes the address's length first.
_LENGTH_BYTE = tuple(bytes((n,)) for n in range(256))


def hashed_visitor_id(hasher, ip_packed: bytes, ua: str) -> int:
    """visitor_id() with the salt and site already in `hasher` (left unchanged)."""
    blake, high = hasher
    blake = blake.copy()
    blake.update(_LENGTH_BYTE[len(ip_packed)] + ip_packed + ua.encode())  # one update: the same bytes
    if high is None:
        return int.from_bytes(blake.digest(), "big", signed=True)
    return high | int.from_bytes(blake.digest(), "big")


class VisitorSalts:
    """The salt of each UTC day, shared through the database."""

    def __init__(self, db: Database, clock: Callable[[], float],
                 random_bytes: Callable[[int], bytes]):
        self.db = db
        self.clock = clock
        self.random_bytes = random_bytes
        self._salts: dict[int, Salt] = {}
        self._pruned_on: int | None = None

    def salt(self, conn: Connection, day: int) -> Salt:
        salt = self._salts.get(day)
        if salt is None:
            salt = read_salt(conn, day)
            if salt is None:
                # The first writer wins, whoever writes meanwhile: no site's lock needed.
                with self.db.transaction(conn, sites=()):
                    insert_salt(conn, day, self.random_bytes(SALT_BYTES), int(self.clock() * 1000))
                salt = read_salt(conn, day)
            self._salts[day] = salt
        return salt

    def prune(self, conn: Connection) -> bool:
        """Forget salts of days before yesterday, once per UTC day of the clock; True if run."""
        today = utc_day(int(self.clock() * 1000))
        if self._pruned_on == today:
            return False
        with self.db.transaction(conn, sites=()):
            delete_salts_before(conn, today - 1)
        self._salts = {day: salt for day, salt in self._salts.items() if day >= today - 1}
        self._pruned_on = today
        return True
