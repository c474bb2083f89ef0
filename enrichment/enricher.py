"""Accepted units -> rows of the events table, run by the flush thread off the request path."""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import Callable

import iptocc

from enrichment.agents import AgentParser, warm_up
from enrichment.memo import Memo
from enrichment.urls import campaign, pathname, url_host
from enrichment.visitor import VisitorSalts, hashed_visitor_id, visitor_hasher
from ingest.queue import Accepted
from storage.db import Database
from storage.events import EventBatch


def country_of(ip_packed: bytes) -> str | None:
    """The country of an address in its one spelling: ::ffff:1.2.3.4 arrives packed as the
    4 bytes of 1.2.3.4 (validation.event.pack_ip), so it gets 1.2.3.4's country."""
    family = socket.AF_INET if len(ip_packed) == 4 else socket.AF_INET6
    return iptocc.country_code(socket.inet_ntop(family, ip_packed))


class Enricher:
    def __init__(self, db: Database, clock: Callable[[], float],
                 random_bytes: Callable[[int], bytes]):
        self.salts = VisitorSalts(db, clock, random_bytes)
        self.agents = AgentParser()
        self._campaigns = Memo(campaign)  # page URLs repeat: parse each query once
        self._referrer_hosts = Memo(url_host)
        self._hashers: dict[tuple[int, int], object] = {}  # (day, site id) -> keyed BLAKE2b

    def warm_up(self) -> None:
        warm_up()

    def prune(self, conn: sqlite3.Connection) -> None:
        if self.salts.prune(conn):
            self._hashers.clear()

    def _hasher(self, conn: sqlite3.Connection, day: int, site_id: int):
        hasher = self._hashers.get((day, site_id))
        if hasher is None:
            if len(self._hashers) >= 10_000:
                self._hashers.clear()
            hasher = visitor_hasher(self.salts.salt(conn, day), site_id)
            self._hashers[(day, site_id)] = hasher
        return hasher

    def build(self, conn: sqlite3.Connection, units: list[Accepted]) -> EventBatch:
        rows: list[list] = []
        usage: dict[tuple[int, str], int] = {}
        describe = self.agents.describe
        campaigns, referrer_hosts = self._campaigns, self._referrer_hosts
        for unit in units:
            site_id = unit.site_id
            hasher = None
            for event in unit.events:
                ua, ip_packed = event.ua, event.ip_packed
                if ua is None:
                    browser = os_family = device = None
                else:
                    browser, os_family, device = describe(ua)
                if ua is None or ip_packed is None:
                    visitor = None
                else:
                    if hasher is None:
                        hasher = self._hasher(conn, unit.day, site_id)
                    visitor = hashed_visitor_id(hasher, ip_packed, ua)
                country = country_of(ip_packed) if ip_packed is not None else None
                referrer = event.referrer
                url = event.url
                rows.append([
                    site_id, event.ts, event.name, visitor,
                    pathname(url, event.authority_end), url, event.host,
                    referrer, referrer and referrer_hosts[referrer], event.title, event.width,
                    event.language, event.uid, event.props, country, browser, os_family, device,
                    *campaigns[url], None,
                ])
            if unit.counted:
                key = (unit.account_id, unit.month)
                usage[key] = usage.get(key, 0) + unit.counted
        return EventBatch(rows, usage, units)
