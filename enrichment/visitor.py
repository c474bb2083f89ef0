"""Visitor ids: a keyed hash of a secret daily salt, the site, the IP and the user agent.

Salts live in the `visitor_salts` table so every worker (and process) hashes the same
visitor to the same id on the same UTC day. Whoever first needs a day's salt creates it
with INSERT OR IGNORE (the first writer wins, everyone then reads the same row); salts
of days before yesterday are deleted, so none is kept longer than 48 hours. The raw IP
is never stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from storage.connection import Connection
from storage.db import Database
from storage.salts import delete_salts_before, insert_salt, read_salt
from vocabulary import DAY_MS

SALT_BYTES = 32


def utc_day(ms: int) -> int:
    """Days since 1970-01-01 UTC."""
    return ms // DAY_MS


def visitor_id(salt: bytes, site_id: int, ip_packed: bytes, ua: str) -> int:
    """A signed 64-bit integer, the form the events table stores."""
    return hashed_visitor_id(visitor_hasher(salt, site_id), ip_packed, ua)


def visitor_hasher(salt: bytes, site_id: int):
    """BLAKE2b keyed with the day's salt and already fed the site, to copy per visitor."""
    return hashlib.blake2b(site_id.to_bytes(8, "big", signed=True), key=salt, digest_size=8)


# The byte of each length, made once: the hash takes the address's length first.
_LENGTH_BYTE = tuple(bytes((n,)) for n in range(256))


def hashed_visitor_id(hasher, ip_packed: bytes, ua: str) -> int:
    """visitor_id() with the salt and site already in `hasher` (left unchanged)."""
    hasher = hasher.copy()
    hasher.update(_LENGTH_BYTE[len(ip_packed)] + ip_packed + ua.encode())  # one update: the same bytes
    return int.from_bytes(hasher.digest(), "big", signed=True)


class VisitorSalts:
    """The salt of each UTC day, shared through the database."""

    def __init__(self, db: Database, clock: Callable[[], float],
                 random_bytes: Callable[[int], bytes]):
        self.db = db
        self.clock = clock
        self.random_bytes = random_bytes
        self._salts: dict[int, bytes] = {}
        self._pruned_on: int | None = None

    def salt(self, conn: Connection, day: int) -> bytes:
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
