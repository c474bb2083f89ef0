"""Browser visitor ids: the `tally_vid` cookie of the tracking script.

The script sends a random id of 128 bits (32 lower-case hex digits) with every event,
after the UTC day the cookie was made (`dddd.`, 4 hex digits) in cookies written since
it dated them. Such events are stored under `browser_visitor_id`: BLAKE2b keyed with one
secret of the installation that never rotates, over the site and the id, as a signed
64-bit integer like the daily ip+ua ids (a dated cookie's id carries its day as a dated
daily id does). So a browser is the same visitor on every day, two sites never share an
id, and nobody can choose the stored id of another visitor.

The flush step `BrowserVisitors.apply` also links the day's ip+ua id of each such event
to the browser's visitor; events without a browser id (the events API, cookieless mode)
whose ip+ua id is linked are stored under the browser's visitor. When several browsers
share one ip+ua on one day, the one seen latest wins.
"""

from __future__ import annotations

from collections.abc import Callable

from enrichment.visitor import utc_day
from storage import browser_ids as store
from storage.browser_ids import browser_visitor_id, is_browser_id
from storage.connection import Connection
from storage.db import Database
from storage.events import EventRow, new_event_row

_VISITOR = EventRow._fields.index("visitor_id")


def _with_visitor(row: EventRow, visitor: int) -> EventRow:
    """`row` with its visitor replaced, made in C (EventRow._replace is Python)."""
    return new_event_row(row[:_VISITOR] + (visitor,) + row[_VISITOR + 1:])

__all__ = ["BrowserIds", "BrowserVisitors", "browser_visitor_id", "is_browser_id"]


class BrowserIds:
    """The installation's key (read once, created on first need) and the ids it gives."""

    def __init__(self, db: Database, clock: Callable[[], float],
                 random_bytes: Callable[[int], bytes]):
        self.db = db
        self.clock = clock
        self.random_bytes = random_bytes
        self._key: bytes | None = None

    def key(self, conn: Connection) -> bytes:
        if self._key is None:
            self._key = store.browser_id_key(conn, self.random_bytes, int(self.clock() * 1000),
                                             self.db)
        return self._key


class BrowserVisitors:
    """The flush step that stores events under browser visitor ids; runs in the flush
    transaction before sessions are assigned (app.build_flusher wires it)."""

    def __init__(self, ids: BrowserIds):
        self.ids = ids
        self._pruned_on: int | None = None

    def apply(self, conn: Connection, batch) -> None:
        """batch: an enrichment.enricher.EventBatch (rows aligned with the units' events);
        rows whose visitor changes are replaced in batch.rows."""
        self.prune(conn)
        self.write(conn, self.resolve(conn, batch))

    def resolve(self, conn: Connection, batch) -> list[tuple]:
        """apply() without its writes (reads only): the rows' visitors replaced, and the
        links to write (write())."""
        rows = batch.rows
        if sum(len(unit.events) for unit in batch.units) != len(rows):
            return []
        links: dict[tuple[int, int], tuple[int, int, int]] = {}  # (site, daily) -> link
        others: dict[int, list[int]] = {}  # site -> indexes of rows with only an ip+ua id
        key = None
        index = 0
        for unit in batch.units:
            site_id, browser_id = unit.site_id, unit.browser_id
            if browser_id is None:
                for row in rows[index:index + len(unit.events)]:
                    if row[_VISITOR] is not None:
                        others.setdefault(site_id, []).append(index)
                    index += 1
                continue
            if key is None:
                key = self.ids.key(conn)
            # One id a unit: its events share the browser.
            visitor = browser_visitor_id(key, site_id, browser_id)
            day = unit.day
            for event in unit.events:
                row = rows[index]
                daily = row[_VISITOR]
                rows[index] = _with_visitor(row, visitor)
                index += 1
                if daily is not None:
                    seen = links.get((site_id, daily))
                    if seen is None or event.ts >= seen[2]:
                        links[(site_id, daily)] = (visitor, day, event.ts)
        sites_linking = {site_id for site_id, _ in links}
        for site_id, indexes in others.items():
            if site_id in sites_linking or store.site_has_links(conn, site_id):
                found = store.linked_visitors(conn, site_id,
                                              {rows[i].visitor_id for i in indexes})
                found.update((daily, link[0]) for (site, daily), link in links.items()
                             if site == site_id)
                for i in indexes:
                    visitor = found.get(rows[i].visitor_id)
                    if visitor is not None:
                        rows[i] = _with_visitor(rows[i], visitor)
        return [(site_id, daily, visitor, day, seen)
                for (site_id, daily), (visitor, day, seen) in links.items()]

    @staticmethod
    def write(conn: Connection, links: list[tuple]) -> None:
        store.write_links(conn, links)

    def prune_due(self) -> bool:
        return self._pruned_on != utc_day(int(self.ids.clock() * 1000))

    def prune(self, conn: Connection) -> None:
        today = utc_day(int(self.ids.clock() * 1000))
        if self._pruned_on != today:
            store.prune_links(conn, today - 1)
            self._pruned_on = today
