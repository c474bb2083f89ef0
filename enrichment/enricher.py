"""The enrich step of the flush: accepted units -> EventRows, off the request path.

Each row gets its visitor id (today's salt), country, browser/OS/device, pathname,
referrer host and campaign parameters. An event that may continue a visit begun the day
before (PREVIOUS_DAY_REACH_MS) is noted, and `previous_visitor_ids` gives it its visitor id
under the previous day's salt inside the flush transaction.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import iptocc

from enrichment.agents import AgentParser, warm_up
from enrichment.memo import Memo
from enrichment.urls import campaign, pathname, url_host
from enrichment.visitor import VisitorSalts, hashed_visitor_id, salt_hasher
from storage.connection import Connection
from storage.db import Database
from storage.events import EventRow, new_event_row
from storage.salts import read_salts
from validation.event import CleanEvent
from vocabulary import DAY_MS, IDENTIFY, SESSION_GAP_MS, TS_FUTURE_MS

# An event needs its visitor id under the salt of the day before its receipt day to open
# or continue a visit only this close to the start of that day: every event stored under
# yesterday's id was received yesterday, so its ts is at most midnight plus the clock skew
# the endpoint accepts, and a visit continues only within the session gap. `$identify`
# needs it always: it links its uid to yesterday's id whenever a visit of that id is
# open, and that link brings yesterday's earlier visits into first touch.
PREVIOUS_DAY_REACH_MS = TS_FUTURE_MS + SESSION_GAP_MS

# Enricher.build unpacks each event in this order.
assert CleanEvent._fields == ("name", "ts", "url", "host", "authority_end", "referrer", "title",
                              "width", "language", "uid", "props", "ip_packed", "ua")


class Unit(Protocol):
    """What the flush stores for one request (ingest.queue.Accepted)."""

    site_id: int
    account_id: int
    month: str
    day: int
    events: Sequence[CleanEvent]
    counted: int
    anonymous: bool
    links_identity: bool


@dataclass
class EventBatch:
    """What the enrich step makes of the units of one flush."""

    rows: list[EventRow]
    usage: dict[tuple[int, str], int]  # (account id, month) -> counted events
    # (row index, unit, event) of the rows that need their visitor id under the salt of the
    # day before their receipt day
    reaching_back: list[tuple[int, Unit, CleanEvent]] = field(default_factory=list)
    units: list = field(default_factory=list)  # the units, in memory only
    # Indexes of the `$identify` rows whose uid must link no visitor (an anonymous identify
    # without a verified identity hash): stored as events, never as identity links.
    unlinked: set[int] = field(default_factory=set)
    usage_totals: dict[tuple[int, str], int] = field(default_factory=dict)  # set by the write
    # The anonymous share of `usage`, and of the totals after the write.
    anonymous_usage: dict[tuple[int, str], int] = field(default_factory=dict)
    anonymous_totals: dict[tuple[int, str], int] = field(default_factory=dict)


def country_of(ip_packed: bytes) -> str | None:
    """The country of an address in its one spelling: ::ffff:1.2.3.4 arrives packed as the
    4 bytes of 1.2.3.4 (validation.event.pack_ip), so it gets 1.2.3.4's country."""
    family = socket.AF_INET if len(ip_packed) == 4 else socket.AF_INET6
    return iptocc.country_code(socket.inet_ntop(family, ip_packed))


def page_parts(url: str, authority_end: int) -> tuple[str, tuple]:
    """(pathname, campaign values) of a page URL whose authority ends at `authority_end`."""
    return pathname(url, authority_end), campaign(url)


class Enricher:
    def __init__(self, db: Database, clock: Callable[[], float],
                 random_bytes: Callable[[int], bytes], cache_entries: int = 10_000):
        self.salts = VisitorSalts(db, clock, random_bytes)
        self.agents = AgentParser(cache_entries)
        # Page URLs repeat: each one's path and campaign values are found once.
        self._pages = Memo(page_parts, cache_entries)
        self._referrer_hosts = Memo(url_host, cache_entries)
        self._cache_entries = cache_entries
        self._hashers: dict[tuple[int, int], object] = {}  # (day, site id) -> keyed BLAKE2b

    def warm_up(self) -> None:
        warm_up()

    def prune(self, conn: Connection) -> None:
        if self.salts.prune(conn):
            self._hashers.clear()

    def _hasher(self, conn: Connection, day: int, site_id: int):
        hasher = self._hashers.get((day, site_id))
        if hasher is None:
            if len(self._hashers) >= self._cache_entries:
                self._hashers.clear()
            hasher = salt_hasher(self.salts.salt(conn, day), day, site_id)
            self._hashers[(day, site_id)] = hasher
        return hasher

    def build(self, conn: Connection, units: list[Unit]) -> EventBatch:
        rows: list[EventRow] = []
        usage: dict[tuple[int, str], int] = {}
        anonymous_usage: dict[tuple[int, str], int] = {}
        wanted = []  # (row index, unit, event) that need yesterday's visitor id
        unlinked: set[int] = set()
        describe = self.agents.describe
        pages, referrer_hosts = self._pages, self._referrer_hosts
        for unit in units:
            site_id, day = unit.site_id, unit.day
            reach = day * DAY_MS + PREVIOUS_DAY_REACH_MS
            hasher = None
            anonymous = 1 if unit.anonymous else None
            links_identity = unit.links_identity
            for event in unit.events:
                # Unpacked in one step: a NamedTuple's fields are each a descriptor call.
                (name, ts, url, host, authority_end, referrer, title, width, language, uid,
                 props, ip_packed, ua) = event
                if ua is None:
                    browser = os_family = device = None
                else:
                    browser, os_family, device = describe(ua)
                if ua is None or ip_packed is None:
                    visitor = None
                else:
                    if hasher is None:
                        hasher = self._hasher(conn, day, site_id)
                    visitor = hashed_visitor_id(hasher, ip_packed, ua)
                    if ts <= reach or name == IDENTIFY:
                        wanted.append((len(rows), unit, event))
                country = country_of(ip_packed) if ip_packed is not None else None
                page = pages.get(url)
                if page is None:
                    page = pages.add(url, authority_end)
                if not links_identity and name == IDENTIFY:
                    unlinked.add(len(rows))
                rows.append(new_event_row((  # EventRow's fields, in order
                    site_id, ts, name, visitor, page[0], url, host,
                    referrer, referrer and referrer_hosts[referrer], title, width, language,
                    uid, props, country, browser, os_family, device, *page[1],
                    anonymous,
                )))
            if unit.counted:
                key = (unit.account_id, unit.month)
                usage[key] = usage.get(key, 0) + unit.counted
                if unit.anonymous:
                    anonymous_usage[key] = anonymous_usage.get(key, 0) + unit.counted
        return EventBatch(rows, usage, wanted, units, unlinked,
                          anonymous_usage=anonymous_usage)


def previous_visitor_ids(conn: Connection, batch: EventBatch) -> list[int | None]:
    """Each row's visitor id under the salt of the day before its receipt day (None where
    not needed or that salt is gone). The salts of every day the batch reaches back to are
    read in the flush transaction, in one statement. A salt not stored is never created
    here: no visit can have been recorded under it."""
    previous: list[int | None] = [None] * len(batch.rows)
    reaching_back = batch.reaching_back
    if not reaching_back:
        return previous
    salts = read_salts(conn, {unit.day - 1 for _, unit, _ in reaching_back})
    hashers: dict[tuple[int, int], object] = {}  # (day, site id) -> keyed hash
    for index, unit, event in reaching_back:
        day, site_id = unit.day - 1, unit.site_id
        hasher = hashers.get((day, site_id), False)
        if hasher is False:
            salt = salts.get(day)
            hasher = hashers[(day, site_id)] = (None if salt is None
                                                else salt_hasher(salt, day, site_id))
        if hasher is not None:
            previous[index] = hashed_visitor_id(hasher, event.ip_packed, event.ua)
    return previous
