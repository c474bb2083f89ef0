"""The SQL of the realtime view: the visitors, pageviews, pages and sources of the last
minutes, counted live from events."""

from __future__ import annotations

from storage.connection import Connection
from storage.statements import statement

_REALTIME_VISITORS = statement(
    "SELECT count(DISTINCT visitor_id) FROM events"
    " WHERE site_id = ? AND ts >= ? AND name <> '$identify'"
)
_REALTIME_MINUTES = statement(
    "SELECT ts / 60000, count(*) FROM events"
    " WHERE site_id = ? AND ts >= ? AND name = 'pageview' GROUP BY 1"
)
_REALTIME_PAGES = statement(
    "SELECT pathname, count(DISTINCT visitor_id), count(*) FROM events"
    " WHERE site_id = ? AND ts >= ? AND name = 'pageview' GROUP BY pathname"
)
_REALTIME_SOURCES = statement(
    "SELECT s.source, count(DISTINCT e.visitor_id) FROM events e"
    " JOIN sessions s ON s.id = e.session_id"
    " WHERE e.site_id = ? AND e.ts >= ? AND e.name <> '$identify' GROUP BY s.source"
)


def realtime_counts(conn: Connection, site_id: int, visitors_since: int,
                    since: int) -> tuple[int, dict[int, int], list, list]:
    visitors = conn.execute(_REALTIME_VISITORS, (site_id, visitors_since)).fetchone()[0]
    minutes = dict(conn.execute(_REALTIME_MINUTES, (site_id, since)).fetchall())
    pages = conn.execute(_REALTIME_PAGES, (site_id, since)).fetchall()
    sources = conn.execute(_REALTIME_SOURCES, (site_id, since)).fetchall()
    return visitors, minutes, pages, sources
