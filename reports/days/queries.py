"""The SQL of traffic counted per UTC day: each day's totals and values counted live from
events and sessions, and the final days stored in traffic_days / traffic_day_dimensions /
traffic_day_values and read back (reports.days.traffic_days decides which days)."""

from __future__ import annotations

from collections.abc import Iterable

from reports.traffic.figures import BreakdownCount, SessionTotals
from storage import db as storage_db
from storage.connection import Connection
from storage.statements import statement
from vocabulary import DAY_MS

# Dimensions read from each event, and those fixed by a session's first event.
EVENT_DIMENSIONS = {"page": "pathname", "country": "country", "device": "device",
                    "browser": "browser", "os": "os", "event": "name"}
SESSION_DIMENSIONS = {"channel": "channel", "source": "source", "entry_page": "entry_path"}
DIMENSIONS = (*SESSION_DIMENSIONS, *EVENT_DIMENSIONS)

_EVENT_TOTALS = statement(
    "SELECT count(*) FILTER (WHERE name = 'pageview'), count(*) FILTER (WHERE name <> 'pageview')"
    " FROM events WHERE site_id = ? AND ts >= ? AND ts < ? AND name <> '$identify'"
)
# Visitors are counted over sessions (a quarter of the rows of events, so half the time of
# a distinct count over events); a visit that crosses midnight counts on the day it began.
_SESSION_TOTALS = statement(
    "SELECT count(DISTINCT visitor_id), count(*),"
    " count(*) FILTER (WHERE pageviews = 1 AND custom_events = 0),"
    " coalesce(sum(last_seen_at - started_at), 0)"
    " FROM sessions WHERE site_id = ? AND started_at >= ? AND started_at < ?"
)
# A site's traffic can only be dated within its life: from its creation (an event may
# carry a time up to TS_PAST_MS earlier), or its first stored event or session when
# earlier (a copied or restored database), to now (an event up to TS_FUTURE_MS later).
# Days outside are known empty: never counted, never stored.
_SITE_LIFE = statement(
    "SELECT (SELECT created_at FROM sites WHERE id = ?1),"
    " (SELECT min(ts) FROM events WHERE site_id = ?1),"
    " (SELECT min(started_at) FROM sessions WHERE site_id = ?1)"
)
_OPEN_SESSION = statement(
    "SELECT 1 FROM sessions WHERE site_id = ? AND started_at >= ? AND started_at < ?"
    " AND last_seen_at >= ? LIMIT 1"
)


def _event_values_sql(column: str) -> str:
    # sql-safe: column comes from the fixed mapping EVENT_DIMENSIONS, values stay parameters
    return (
        f"SELECT {column}, count(DISTINCT visitor_id),"  # noqa: S608 - fixed column
        " count(*) FILTER (WHERE name = 'pageview'), count(*) FILTER (WHERE name <> 'pageview')"
        " FROM events WHERE site_id = ? AND ts >= ? AND ts < ? AND name <> '$identify'"
        + (" AND name <> 'pageview'" if column == "name" else "")
        + f" GROUP BY {column}"  # sql-safe: fixed column from EVENT_DIMENSIONS
    )


def _session_values_sql(column: str) -> str:
    # sql-safe: column comes from the fixed mapping SESSION_DIMENSIONS, values stay parameters
    return (
        f"SELECT {column}, count(DISTINCT visitor_id),"  # noqa: S608 - fixed column
        " sum(pageviews), sum(custom_events)"
        " FROM sessions WHERE site_id = ? AND started_at >= ? AND started_at < ?"
        f" GROUP BY {column}"  # sql-safe: fixed column from SESSION_DIMENSIONS
    )


VALUES_SQL = {
    **{by: statement(_session_values_sql(column)) for by, column in SESSION_DIMENSIONS.items()},
    **{by: statement(_event_values_sql(column)) for by, column in EVENT_DIMENSIONS.items()},
}

# What is stored for a day: its totals (a traffic_days row), and per dimension a
# traffic_day_dimensions row with the day's traffic_day_values rows (possibly none).
_STORED_TOTALS = statement(
    "SELECT day, visitors, pageviews, sessions, events, bounces, duration_ms FROM traffic_days"
    " WHERE site_id = ? AND day >= ? AND day <= ?"
)
_STORED_DIMENSION_DAYS = statement(
    "SELECT day FROM traffic_day_dimensions"
    " WHERE site_id = ? AND dimension = ? AND day >= ? AND day <= ?"
)
_STORED_VALUES = statement(
    "SELECT value, sum(visitors), sum(pageviews), sum(events) FROM traffic_day_values"
    " WHERE site_id = ? AND dimension = ? AND day >= ? AND day <= ? GROUP BY value"
)
_STORE_TOTALS = statement(
    "INSERT INTO traffic_days (site_id, day, visitors, pageviews, sessions, events, bounces,"
    " duration_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_STORE_DIMENSION = statement(
    "INSERT INTO traffic_day_dimensions (site_id, day, dimension) VALUES (?, ?, ?)"
    " ON CONFLICT DO NOTHING"
)
_STORE_VALUE = statement(
    "INSERT INTO traffic_day_values (site_id, day, dimension, value, visitors, pageviews, events)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def live_totals(conn: Connection, site_id: int, day: int) -> SessionTotals:
    bounds = (site_id, day * DAY_MS, (day + 1) * DAY_MS)
    pageviews, events = conn.execute(_EVENT_TOTALS, bounds).fetchone()
    visitors, sessions, bounces, duration_ms = conn.execute(_SESSION_TOTALS, bounds).fetchone()
    return SessionTotals(visitors, pageviews, sessions, events, bounces, duration_ms)


def live_values(conn: Connection, site_id: int, day: int, by: str) -> list[BreakdownCount]:
    rows = conn.execute(VALUES_SQL[by], (site_id, day * DAY_MS, (day + 1) * DAY_MS))
    return [BreakdownCount(value, visitors, pageviews or 0, events or 0)
            for value, visitors, pageviews, events in rows]


def site_life(conn: Connection, site_id: int) -> tuple[int | None, int | None, int | None]:
    """The site's creation, its first stored event and its first session (each None when
    there is none)."""
    return conn.execute(_SITE_LIFE, (site_id,)).fetchone()


def session_open(conn: Connection, site_id: int, t0: int, t1: int,
                 seen_since: int) -> bool:
    """Whether a session started in [t0, t1) was seen at or after `seen_since`."""
    return conn.execute(_OPEN_SESSION, (site_id, t0, t1, seen_since)).fetchone() is not None


def stored_totals(conn: Connection, site_id: int, first: int,
                  last: int) -> dict[int, SessionTotals]:
    return {row[0]: SessionTotals(*row[1:]) for row in conn.execute(
        _STORED_TOTALS, (site_id, first, last))}


def store_totals(conn: Connection, site_id: int, day: int, totals: SessionTotals) -> None:
    conn.execute(_STORE_TOTALS, (site_id, day, *totals))


def stored_dimension_days(conn: Connection, site_id: int, by: str, first: int,
                          last: int) -> set[int]:
    return {row[0] for row in conn.execute(_STORED_DIMENSION_DAYS, (site_id, by, first, last))}


def stored_values(conn: Connection, site_id: int, by: str, first: int,
                  last: int) -> list[BreakdownCount]:
    return [BreakdownCount(*row) for row in conn.execute(
        _STORED_VALUES, (site_id, by, first, last))]


def store_values(conn: Connection, site_id: int, day: int, by: str,
                 counts: Iterable[BreakdownCount]) -> None:
    """A day's values of one dimension, unless another worker stored them first."""
    if conn.execute(_STORE_DIMENSION, (site_id, day, by)).rowcount:
        conn.executemany(_STORE_VALUE, [
            (site_id, day, by, c.value, c.visitors, c.pageviews, c.events) for c in counts])


def set_busy_timeout(conn: Connection, ms: int) -> None:
    storage_db.set_busy_timeout(conn, ms)
