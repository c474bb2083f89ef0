"""The SQL of filtered traffic (a segment: filters and an optional goal), per time bucket.

Filters become fixed SQL fragments chosen from a whitelist (the column of each dimension,
the form of each operator); their values are always parameters, given as a JSON array
read with json_each, so a filter of any length keeps the same statement text.

Within a bucket [t0, t1):
- the segment's sessions are those started in the bucket that pass the session filters
  and, with event filters, have a matching event (dated from t0 to a day after t1);
- pageviews and custom events are the events dated in the bucket that pass every filter
  (session filters through the event's session);
- a goal converts a segment session that has a goal event (from t0 to a day after t1);
  goal events are those events.

Several buckets are counted by one statement (`Segment.bucket_totals`, GROUP BY bucket),
each session held to its own bucket's window, so the figures are those of one statement
per bucket. A `~` (contains) filter is not tested on each row: `resolve` matches its
values once against the distinct values the range stores for its dimension (the same
instr/lower test, by the database, so the same case rules), and the rows are then kept by
membership in that set, as `==` keeps them. Its cost grows with what is stored, not with
rows x filters x values.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import orjson

from reports.segments.filters import Filter, Goal
from reports.shared.params import DAY_MS
from storage.connection import Connection

SESSION_COLUMNS = {"channel": "s.channel", "source": "s.source", "medium": "s.utm_medium",
                   "campaign": "s.utm_campaign", "entry_page": "s.entry_path"}
EVENT_COLUMNS = {"page": "e.pathname", "hostname": "e.hostname", "country": "e.country",
                 "device": "e.device", "browser": "e.browser", "os": "e.os", "event": "e.name"}
# Breakdown dimensions (reports.days.queries.DIMENSIONS) and their columns.
BREAKDOWN_SESSION_COLUMNS = {"channel": "s.channel", "source": "s.source",
                             "entry_page": "s.entry_path", "medium": "s.utm_medium",
                             "campaign": "s.utm_campaign", "term": "s.utm_term",
                             "content": "s.utm_content", "referrer": "s.referrer",
                             "landing_page": "s.landing_page"}
BREAKDOWN_EVENT_COLUMNS = {"page": "e.pathname", "country": "e.country", "device": "e.device",
                           "browser": "e.browser", "os": "e.os", "event": "e.name"}


def _column_clauses(column: str) -> dict[str, str]:
    # sql-safe: column comes from the fixed mappings above; values are a JSON parameter
    return {
        "==": f"{column} IN (SELECT value FROM json_each(?))",  # noqa: S608 - fixed fragments
        "!=": f"({column} IS NULL OR {column} NOT IN (SELECT value FROM json_each(?)))",  # noqa: S608 - fixed fragments
    }


_CLAUSES = {dim: _column_clauses(col) for dim, col in {**SESSION_COLUMNS, **EVENT_COLUMNS}.items()}
# A property filter takes two parameters: the key, then the values.
_PROP_MATCH = "EXISTS (SELECT 1 FROM json_each(e.props) p WHERE p.key = ? AND "
_CLAUSES["prop"] = {
    "==": _PROP_MATCH + "CAST(p.value AS TEXT) IN (SELECT value FROM json_each(?)))",  # noqa: S608 - fixed fragments
    "!=": "NOT " + _PROP_MATCH + "CAST(p.value AS TEXT) IN (SELECT value FROM json_each(?)))",  # noqa: S608 - fixed fragments
}
_GOAL_CLAUSES = {"event": "e.name = ?", "page": "e.name = 'pageview' AND e.pathname = ?"}

# `~` (contains, ignoring ASCII case): the distinct values a dimension stores over a span,
# and of those the ones containing one of the filter's values (a parameter each filter).
# A session dimension's values are those of the sessions started in the span and of the
# sessions of the span's events (an event's session may have started before it).
_STORED_EVENT_VALUES = (
    "SELECT DISTINCT {column} AS v FROM events e"
    " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ? AND e.name <> '$identify'"
)
_STORED_SESSION_VALUES = (
    "SELECT {column} AS v FROM sessions s"
    " WHERE s.site_id = ? AND s.started_at >= ? AND s.started_at < ?"
    " UNION SELECT {column} AS v FROM sessions s WHERE s.id IN (SELECT e.session_id FROM events e"
    " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ?)"
)
_STORED_PROP_VALUES = (
    "SELECT DISTINCT CAST(p.value AS TEXT) AS v FROM events e CROSS JOIN json_each(e.props) p"
    " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ? AND e.name <> '$identify'"
    " AND e.props IS NOT NULL AND p.key = ?"
)
_CONTAINS = " AND EXISTS (SELECT 1 FROM json_each(?) WHERE instr(lower(d.v), lower(value)) > 0)"


def _stored_values_sql(dimension: str) -> str:
    if dimension == "prop":
        return _STORED_PROP_VALUES
    if dimension in SESSION_COLUMNS:
        # sql-safe: a column of the fixed mapping SESSION_COLUMNS
        return _STORED_SESSION_VALUES.format(column=SESSION_COLUMNS[dimension])
    # sql-safe: a column of the fixed mapping EVENT_COLUMNS
    return _STORED_EVENT_VALUES.format(column=EVENT_COLUMNS[dimension])


def matching_values(conn: Connection, site_id: int, dimension: str, prop: str | None,
                    value_lists: list[tuple[str, ...]], start: int, end: int) -> list[str]:
    """The values the dimension (or property `prop`) takes over [start, end) that contain,
    ignoring ASCII case, one value of each list: what the `~` filters on it all keep."""
    span = (site_id, start, end)
    head = (*span, prop) if dimension == "prop" else span * (
        2 if dimension in SESSION_COLUMNS else 1)
    rows = conn.execute(
        # sql-safe: fixed fragments, a _CONTAINS per filter; values are JSON parameters
        "SELECT d.v FROM (" + _stored_values_sql(dimension) + ") d WHERE d.v IS NOT NULL"  # noqa: S608 - fixed
        + _CONTAINS * len(value_lists),
        (*head, *(orjson.dumps(list(values)).decode() for values in value_lists)))
    return sorted(row[0] for row in rows)


def resolve(conn: Connection, site_id: int, filters: tuple[Filter, ...],
            start: int, end: int) -> tuple[Filter, ...]:
    """The filters with the `~` filters of each dimension made one `==` filter listing the
    values stored over [start, end) that they all keep: the same rows pass, for any rows
    of that span."""
    contains: dict[tuple[str, str | None], list[tuple[str, ...]]] = defaultdict(list)
    kept = []
    for f in filters:
        if f.operator == "~":
            contains[(f.dimension, f.prop)].append(f.values)
        else:
            kept.append(f)
    for (dimension, prop), value_lists in sorted(contains.items(), key=str):
        values = matching_values(conn, site_id, dimension, prop, value_lists, start, end)
        kept.append(Filter(dimension, "==", tuple(values), prop))
    return tuple(kept)


# Counting many buckets at once, a session (m, the event's) counts in the bucket its start
# falls in, with the events dated from that bucket's start to a day after its end, as a
# statement for that one bucket would count it. Compared as bucket numbers, so no index
# seeks events per session (PostgreSQL would, once per session, on a range a day long).
# Parameters: start and end of the span; then start, width four times; then the buckets
# in a width and a day (1 + a day / width, a width dividing a day).
_WINDOW = (
    " AND m.site_id = e.site_id AND m.started_at >= ? AND m.started_at < ?"
    " AND (e.ts - ?) / ? >= (m.started_at - ?) / ?"
    " AND (e.ts - ?) / ? < (m.started_at - ?) / ? + ?"
)


class Where(NamedTuple):
    sql: str  # " AND ..." fragments, or ""
    params: tuple


def _where(filters: tuple[Filter, ...]) -> Where:
    sql, params = [], []
    for f in filters:
        if f.operator not in _CLAUSES[f.dimension]:
            raise ValueError(f"resolve {f.text()!r} first (reports.segments.queries.resolve)")
        sql.append(_CLAUSES[f.dimension][f.operator])
        if f.dimension == "prop":
            params.append(f.prop)
        params.append(orjson.dumps(list(f.values)).decode())
    return Where("".join(" AND " + s for s in sql), tuple(params))


class SegmentTotals(NamedTuple):
    visitors: int = 0
    pageviews: int = 0
    sessions: int = 0
    events: int = 0
    bounces: int = 0
    duration_ms: int = 0
    conversions: int = 0  # distinct visitor ids of the segment's sessions with a goal event
    goal_events: int = 0


class SegmentCount(NamedTuple):
    value: str | None
    visitors: int
    pageviews: int
    events: int
    conversions: int = 0
    goal_events: int = 0


class Segment:
    """The statements of one segment (built once per report from fixed fragments)."""

    def __init__(self, filters: tuple[Filter, ...], goal: Goal | None):
        self.filters = filters
        self.goal = goal
        self.session_where = _where(tuple(f for f in filters if f.is_session))
        self.event_where = _where(tuple(f for f in filters if not f.is_session))
        self.needs_session_join = bool(self.session_where.sql)
        join = " LEFT JOIN sessions s ON s.id = e.session_id" if self.needs_session_join else ""
        # sql-safe: fragments from the fixed clause tables above; values are parameters
        self.events_from = (  # sql-safe: fixed fragments only
            " FROM events e" + join +  # sql-safe: fixed fragment
            " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ? AND e.name <> '$identify'"
            + self.session_where.sql + self.event_where.sql)  # sql-safe: fixed fragments
        self.events_params = self.session_where.params + self.event_where.params
        matching = ""
        if self.event_where.sql:
            matching = (" AND s.id IN (SELECT e.session_id FROM events e"  # noqa: S608 - fixed fragments
                        " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ? AND e.name <> '$identify'"
                        + self.event_where.sql + ")")  # sql-safe: fixed fragments
        self.sessions_where = (  # sql-safe: fixed fragments only
            " WHERE s.site_id = ? AND s.started_at >= ? AND s.started_at < ?"
            + self.session_where.sql + matching)  # sql-safe: fixed fragments
        self.goal_sql = None
        if goal is not None:
            self.goal_sql = (  # sql-safe: fixed fragments only
                " LEFT JOIN (SELECT e.session_id, count(*) AS n FROM events e"  # noqa: S608 - fixed fragments
                " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ? AND "
                + _GOAL_CLAUSES[goal.kind] + " GROUP BY e.session_id) g ON g.session_id = s.id")
        # The same over many buckets: each event held to its session's bucket window (m).
        # A join to the matching sessions, grouped, rather than IN: no plan can then scan
        # events once per session.
        self.bucket_matching = ""
        if self.event_where.sql:
            self.bucket_matching = (  # sql-safe: fixed fragments only
                " JOIN (SELECT e.session_id FROM events e JOIN sessions m"  # noqa: S608 - fixed fragments
                " ON m.id = e.session_id WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ?"
                " AND e.name <> '$identify'" + self.event_where.sql + _WINDOW
                + " GROUP BY e.session_id) matching ON matching.session_id = s.id")
        self.bucket_goal_sql = ""
        if goal is not None:
            self.bucket_goal_sql = (  # sql-safe: fixed fragments only
                " LEFT JOIN (SELECT e.session_id, count(*) AS n FROM events e JOIN sessions m"  # noqa: S608 - fixed fragments
                " ON m.id = e.session_id WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ? AND "
                + _GOAL_CLAUSES[goal.kind] + _WINDOW
                + " GROUP BY e.session_id) g ON g.session_id = s.id")

    def _sessions_params(self, site_id: int, t0: int, t1: int) -> tuple:
        params = (site_id, t0, t1, *self.session_where.params)
        if self.event_where.sql:
            params += (site_id, t0, t1 + DAY_MS, *self.event_where.params)
        return params

    def _goal_params(self, site_id: int, t0: int, t1: int) -> tuple:
        return (site_id, t0, t1 + DAY_MS, self.goal.name) if self.goal else ()

    def bucket_totals(self, conn: Connection, site_id: int, start: int, end: int,
                      width: int) -> dict[int, SegmentTotals]:
        """The figures of each bucket [start + i * width, start + (i + 1) * width) of
        [start, end), by i (a bucket without sessions or events is left out): those of the
        segment's statements for one bucket, for every bucket in two statements. `width`
        divides a day (an hour, a day)."""
        if DAY_MS % width:
            raise ValueError(f"a bucket of {width} ms does not divide a day")
        # With session filters only, the segment's events are its sessions' (the counts each
        # session keeps): one read of the sessions instead of a join per event.
        by_sessions = self.needs_session_join and not self.event_where.sql
        event_counts: dict[int, tuple[int, int]] = {}
        if not by_sessions:
            for bucket, pageviews, events in conn.execute(
                    "SELECT (e.ts - ?) / ? AS bucket, count(*) FILTER (WHERE e.name = 'pageview'),"
                    " count(*) FILTER (WHERE e.name <> 'pageview')"
                    + self.events_from  # sql-safe: built from fixed fragments in __init__
                    + " GROUP BY bucket",
                    (start, width, site_id, start, end, *self.events_params)):
                event_counts[bucket] = (pageviews, events)
        window = (start, end, *(start, width) * 4, 1 + DAY_MS // width)
        goal_params = (site_id, start, end + DAY_MS, self.goal.name, *window) if self.goal else ()
        matching_params = ((site_id, start, end + DAY_MS, *self.event_where.params, *window)
                           if self.event_where.sql else ())
        goal_columns = (", count(DISTINCT CASE WHEN g.n > 0 THEN s.visitor_id END),"
                        " coalesce(sum(g.n), 0)") if self.goal else ", 0, 0"
        rows = conn.execute(
            "SELECT (s.started_at - ?) / ? AS bucket, count(DISTINCT s.visitor_id), count(*),"  # noqa: S608 - fixed fragments
            " count(*) FILTER (WHERE s.pageviews = 1 AND s.custom_events = 0),"
            " coalesce(sum(s.last_seen_at - s.started_at), 0)" + goal_columns
            + ", coalesce(sum(s.pageviews), 0), coalesce(sum(s.custom_events), 0)"
            + " FROM sessions s" + self.bucket_goal_sql + self.bucket_matching  # sql-safe: fixed
            + " WHERE s.site_id = ? AND s.started_at >= ? AND s.started_at < ?"
            + self.session_where.sql + " GROUP BY bucket",  # sql-safe: fixed fragments
            (start, width, *goal_params, *matching_params, site_id, start, end,
             *self.session_where.params))
        totals = {}
        for (bucket, visitors, sessions, bounces, duration, conversions, goal_events,
             pageviews, events) in rows:
            if not by_sessions:
                pageviews, events = event_counts.pop(bucket, (0, 0))
            totals[bucket] = SegmentTotals(visitors, pageviews, sessions, events, bounces,
                                           duration, conversions, goal_events)
        for bucket, (pageviews, events) in event_counts.items():  # events, no session start
            totals[bucket] = SegmentTotals(0, pageviews, 0, events)
        return totals

    def values(self, conn: Connection, site_id: int, t0: int, t1: int,
               by: str) -> list[SegmentCount]:
        if by in BREAKDOWN_SESSION_COLUMNS:
            column = BREAKDOWN_SESSION_COLUMNS[by]
            goal_columns = (", count(DISTINCT CASE WHEN g.n > 0 THEN s.visitor_id END),"
                            " coalesce(sum(g.n), 0)") if self.goal_sql else ", 0, 0"
            rows = conn.execute(
                # sql-safe: column from the fixed mapping; the rest fixed fragments
                f"SELECT {column}, count(DISTINCT s.visitor_id), sum(s.pageviews),"  # noqa: S608 - fixed
                " sum(s.custom_events)" + goal_columns  # sql-safe: fixed fragments
                + " FROM sessions s" + (self.goal_sql or "") + self.sessions_where  # sql-safe: fixed
                + f" GROUP BY {column}",  # sql-safe: fixed column
                (*self._goal_params(site_id, t0, t1), *self._sessions_params(site_id, t0, t1)))
        else:
            column = BREAKDOWN_EVENT_COLUMNS[by]
            goal_columns, goal_params = ", 0, 0", ()
            if self.goal is not None:
                goal_columns = (
                    ", count(DISTINCT CASE WHEN e.visitor_id IN (SELECT e2.visitor_id FROM events e2"  # noqa: S608 - fixed fragments
                    " WHERE e2.site_id = ? AND e2.ts >= ? AND e2.ts < ? AND "
                    + _GOAL_CLAUSES[self.goal.kind].replace("e.", "e2.")
                    + ") THEN e.visitor_id END), count(*) FILTER (WHERE "
                    + _GOAL_CLAUSES[self.goal.kind] + ")")
                goal_params = (site_id, t0, t1 + DAY_MS, self.goal.name, self.goal.name)
            rows = conn.execute(
                # sql-safe: column from the fixed mapping; the rest fixed fragments
                f"SELECT {column}, count(DISTINCT e.visitor_id),"  # noqa: S608 - fixed column
                " count(*) FILTER (WHERE e.name = 'pageview'),"
                " count(*) FILTER (WHERE e.name <> 'pageview')" + goal_columns
                + self.events_from  # sql-safe: fixed fragments
                + (" AND e.name <> 'pageview'" if by == "event" else "")
                + f" GROUP BY {column}",  # sql-safe: fixed column
                (*goal_params, site_id, t0, t1, *self.events_params))
        return [SegmentCount(value, visitors, pageviews or 0, events or 0, conversions,
                             goal_events)
                for value, visitors, pageviews, events, conversions, goal_events in rows]


# A segment's final days, stored (reports.segments.segment_days): the segments a site
# keeps, and per segment the figures of each stored day, dimension and value.
_REGISTER = (
    "INSERT INTO traffic_segments (site_id, segment, created_at)"
    " SELECT ?1, ?2, ?3 WHERE (SELECT count(*) FROM traffic_segments WHERE site_id = ?1) < ?4"
    " ON CONFLICT DO NOTHING"
)
_REGISTERED = "SELECT 1 FROM traffic_segments WHERE site_id = ? AND segment = ?"
_STORED_TOTALS = (
    "SELECT day, visitors, pageviews, sessions, events, bounces, duration_ms, conversions,"
    " goal_events FROM traffic_segment_days"
    " WHERE site_id = ? AND segment = ? AND day >= ? AND day <= ?"
)
_STORE_TOTALS = (
    "INSERT INTO traffic_segment_days (site_id, segment, day, visitors, pageviews, sessions,"
    " events, bounces, duration_ms, conversions, goal_events)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_STORED_DIMENSION_DAYS = (
    "SELECT day FROM traffic_segment_dimensions"
    " WHERE site_id = ? AND segment = ? AND dimension = ? AND day >= ? AND day <= ?"
)
_STORED_VALUES = (
    "SELECT value, sum(visitors), sum(pageviews), sum(events), sum(conversions),"
    " sum(goal_events) FROM traffic_segment_values"
    " WHERE site_id = ? AND segment = ? AND dimension = ? AND day >= ? AND day <= ?"
    " GROUP BY value"
)
_STORE_DIMENSION = (
    "INSERT INTO traffic_segment_dimensions (site_id, segment, dimension, day)"
    " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_STORE_VALUE = (
    "INSERT INTO traffic_segment_values (site_id, segment, dimension, day, value, visitors,"
    " pageviews, events, conversions, goal_events) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def register_segment(conn: Connection, site_id: int, key: str, now_ms: int,
                     most: int) -> bool:
    """Whether the segment is (now) one of the site's stored segments, at most `most` of them."""
    conn.execute(_REGISTER, (site_id, key, now_ms, most))
    return conn.execute(_REGISTERED, (site_id, key)).fetchone() is not None


def stored_segment_totals(conn: Connection, site_id: int, key: str, first: int,
                          last: int) -> dict[int, SegmentTotals]:
    return {row[0]: SegmentTotals(*row[1:]) for row in conn.execute(
        _STORED_TOTALS, (site_id, key, first, last))}


def store_segment_totals(conn: Connection, site_id: int, key: str,
                         totals: dict[int, SegmentTotals]) -> None:
    conn.executemany(_STORE_TOTALS, [(site_id, key, day, *figures)
                                     for day, figures in totals.items()])


def stored_segment_dimension_days(conn: Connection, site_id: int, key: str, by: str,
                                  first: int, last: int) -> set[int]:
    return {row[0] for row in conn.execute(
        _STORED_DIMENSION_DAYS, (site_id, key, by, first, last))}


def stored_segment_values(conn: Connection, site_id: int, key: str, by: str,
                          first: int, last: int) -> list[SegmentCount]:
    return [SegmentCount(*row) for row in conn.execute(
        _STORED_VALUES, (site_id, key, by, first, last))]


def store_segment_values(conn: Connection, site_id: int, key: str, by: str, day: int,
                         counts: list[SegmentCount]) -> None:
    """A day's values of one dimension, unless another worker stored them first."""
    if conn.execute(_STORE_DIMENSION, (site_id, key, by, day)).rowcount:
        conn.executemany(_STORE_VALUE, [(site_id, key, by, day, *count) for count in counts])
