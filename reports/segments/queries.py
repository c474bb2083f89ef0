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

from reports.segments.filters import Filter, Goal, contains, prop_equal
from reports.shared.params import DAY_MS
from storage.connection import Connection
from storage.statements import EMPTY, Fragment, fragment, join, statement, template

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


_SESSION_PROBE = "SELECT 1 FROM sessions s WHERE s.id = 1{}"
_EVENT_PROBE = "SELECT 1 FROM events e WHERE e.id = 1{}"


def _column_clauses(column: str, probe: str) -> dict[str, Fragment]:
    # sql-safe: column comes from the fixed mappings above; values are a JSON parameter
    return {
        "==": fragment(f" AND {column} IN (SELECT value FROM json_each(?))", probe),  # noqa: S608 - fixed fragments
        "!=": fragment(f" AND ({column} IS NULL OR {column} NOT IN (SELECT value FROM json_each(?)))", probe),  # noqa: S608 - fixed fragments
    }


_CLAUSES = {
    **{dim: _column_clauses(col, _SESSION_PROBE) for dim, col in SESSION_COLUMNS.items()},
    **{dim: _column_clauses(col, _EVENT_PROBE) for dim, col in EVENT_COLUMNS.items()},
}
# A property filter takes two parameters: the key, then the values (the texts the engine
# stores for them, resolved by value first: `resolve`).
_PROP_MATCH = "EXISTS (SELECT 1 FROM json_each(e.props) p WHERE p.key = ? AND "
_CLAUSES["prop"] = {
    "==": fragment(" AND " + _PROP_MATCH + "CAST(p.value AS TEXT) IN (SELECT value FROM json_each(?)))", _EVENT_PROBE),  # noqa: S608 - fixed fragments
    "!=": fragment(" AND NOT " + _PROP_MATCH + "CAST(p.value AS TEXT) IN (SELECT value FROM json_each(?)))", _EVENT_PROBE),  # noqa: S608 - fixed fragments
}
_GOAL_CLAUSES = {
    "event": fragment(" AND e.name = ?", _EVENT_PROBE),
    "page": fragment(" AND e.name = 'pageview' AND e.pathname = ?", _EVENT_PROBE),
}
_GOAL_CLAUSES_OF_E2 = {
    "event": fragment(" AND e2.name = ?", "SELECT 1 FROM events e2 WHERE e2.id = 1{}"),
    "page": fragment(" AND e2.name = 'pageview' AND e2.pathname = ?",
                     "SELECT 1 FROM events e2 WHERE e2.id = 1{}"),
}

# The distinct values a dimension stores over a span, which `resolve` matches filters
# against (in Python, by reports.segments.filters' rules: one meaning, whichever engine).
# A session dimension's values are those of the sessions started in the span and of the
# sessions of the span's events (an event's session may have started before it).
_STORED_EVENT_VALUES = (
    "SELECT DISTINCT {column} AS v FROM events e"
    " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ? AND e.name <> '$identify'"
    " AND {column} IS NOT NULL"
)
_STORED_SESSION_VALUES = (
    "SELECT {column} AS v FROM sessions s"
    " WHERE s.site_id = ? AND s.started_at >= ? AND s.started_at < ? AND {column} IS NOT NULL"
    " UNION SELECT {column} AS v FROM sessions s WHERE s.id IN (SELECT e.session_id FROM events e"
    " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ?) AND {column} IS NOT NULL"
)
_STORED_VALUES_OF = {
    **{dim: statement(_STORED_SESSION_VALUES.format(column=col))  # sql-safe: fixed columns
       for dim, col in SESSION_COLUMNS.items()},
    **{dim: statement(_STORED_EVENT_VALUES.format(column=col))  # sql-safe: fixed columns
       for dim, col in EVENT_COLUMNS.items()},
    # The text each value is stored as (what a filter's membership test compares), and the
    # value itself (a number as a number on SQLite, whose text keeps 15 digits).
    "prop": statement(
        "SELECT DISTINCT CAST(p.value AS TEXT) AS v, p.value FROM events e"
        " CROSS JOIN json_each(e.props) p"
        " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ? AND e.name <> '$identify'"
        " AND e.props IS NOT NULL AND p.key = ? AND p.value IS NOT NULL"),
}


def stored_values(conn: Connection, site_id: int, dimension: str, prop: str | None,
                  start: int, end: int) -> list[str]:
    """The values the dimension (or property `prop`) takes over [start, end), as the engine
    stores their text."""
    return [row[0] for row in _stored(conn, site_id, dimension, prop, start, end)]


def _stored(conn: Connection, site_id: int, dimension: str, prop: str | None,
            start: int, end: int) -> list[tuple]:
    span = (site_id, start, end)
    params = (*span, prop) if dimension == "prop" else span * (
        2 if dimension in SESSION_COLUMNS else 1)
    return conn.execute(_STORED_VALUES_OF[dimension], params).fetchall()


def matching_values(conn: Connection, site_id: int, dimension: str, prop: str | None,
                    value_lists: list[tuple[str, ...]], start: int, end: int) -> list[str]:
    """The values the dimension (or property `prop`) takes over [start, end) that contain,
    ignoring case (reports.segments.filters.contains), one value of each list: what the
    `~` filters on it all keep."""
    return sorted(value for value in stored_values(conn, site_id, dimension, prop, start, end)
                  if all(any(contains(value, v) for v in values) for values in value_lists))


def resolve(conn: Connection, site_id: int, filters: tuple[Filter, ...],
            start: int, end: int) -> tuple[Filter, ...]:
    """The filters with the `~` filters of each dimension made one `==` filter listing the
    values stored over [start, end) that they all keep, and each property's `==` and `!=`
    values made the stored texts equal to them (reports.segments.filters.prop_equal: a
    number by its value): the same rows pass, for any rows of that span."""
    contains_lists: dict[tuple[str, str | None], list[tuple[str, ...]]] = defaultdict(list)
    kept = []
    stored: dict[str | None, list[tuple]] = {}
    for f in filters:
        if f.operator == "~":
            contains_lists[(f.dimension, f.prop)].append(f.values)
        elif f.dimension == "prop":
            if f.prop not in stored:
                stored[f.prop] = _stored(conn, site_id, "prop", f.prop, start, end)
            equal = tuple(sorted({text for text, value in stored[f.prop]
                                  if any(prop_equal(value, wanted) for wanted in f.values)}))
            kept.append(Filter(f.dimension, f.operator, equal, f.prop))
        else:
            kept.append(f)
    for (dimension, prop), value_lists in sorted(contains_lists.items(), key=str):
        values = matching_values(conn, site_id, dimension, prop, value_lists, start, end)
        kept.append(Filter(dimension, "==", tuple(values), prop))
    return tuple(kept)


# Counting many buckets at once, a session (m, the event's) counts in the bucket its start
# falls in, with the events dated from that bucket's start to a day after its end, as a
# statement for that one bucket would count it. Compared as bucket numbers, so no index
# seeks events per session (PostgreSQL would, once per session, on a range a day long).
# Parameters: start and end of the span; then start, width four times; then the buckets
# in a width and a day (1 + a day / width, a width dividing a day).
_WINDOW = fragment(
    " AND m.site_id = e.site_id AND m.started_at >= ? AND m.started_at < ?"
    " AND (e.ts - ?) / ? >= (m.started_at - ?) / ?"
    " AND (e.ts - ?) / ? < (m.started_at - ?) / ? + ?",
    probe="SELECT 1 FROM events e JOIN sessions m ON m.id = e.session_id WHERE e.id = 1{}")


class Where(NamedTuple):
    sql: Fragment  # " AND ..." fragments, or EMPTY
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
    return Where(join(sql), tuple(params))


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


# The pieces of a segment's statements (`Segment`): each slot takes a fragment above or
# below, or is left empty.
_SESSION_JOIN = fragment(" LEFT JOIN sessions s ON s.id = e.session_id",
                         probe="SELECT 1 FROM events e{} WHERE s.id = 1")
# The segment's sessions with a matching event (dated from t0 to a day after t1).
_MATCHING_SESSIONS = fragment(
    " AND s.id IN (SELECT e.session_id FROM events e"
    " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ? AND e.name <> '$identify'{event_where})",
    probe=_SESSION_PROBE)
_GOAL_JOIN = fragment(
    " LEFT JOIN (SELECT e.session_id, count(*) AS n FROM events e"
    " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ?{goal}"
    " GROUP BY e.session_id) g ON g.session_id = s.id",
    probe="SELECT g.n FROM sessions s{}")
# The same over many buckets: each event held to its session's bucket window (m).
# A join to the matching sessions, grouped, rather than IN: no plan can then scan
# events once per session.
_BUCKET_MATCHING = fragment(
    " JOIN (SELECT e.session_id FROM events e JOIN sessions m"  # noqa: S608 - fixed fragments
    " ON m.id = e.session_id WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ?"
    " AND e.name <> '$identify'{event_where}" + _WINDOW
    + " GROUP BY e.session_id) matching ON matching.session_id = s.id",
    probe="SELECT 1 FROM sessions s{}")
_BUCKET_GOAL_JOIN = fragment(
    " LEFT JOIN (SELECT e.session_id, count(*) AS n FROM events e JOIN sessions m"  # noqa: S608 - fixed fragments
    " ON m.id = e.session_id WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ?{goal}" + _WINDOW
    + " GROUP BY e.session_id) g ON g.session_id = s.id",
    probe="SELECT g.n FROM sessions s{}")
_NO_GOAL_COLUMNS = fragment(", 0, 0", probe="SELECT 1{}")
_SESSION_GOAL_COLUMNS = fragment(
    ", count(DISTINCT CASE WHEN g.n > 0 THEN s.visitor_id END), coalesce(sum(g.n), 0)",
    probe="SELECT 1{} FROM sessions s LEFT JOIN (SELECT 1 AS n) g ON true")
_EVENT_GOAL_COLUMNS = fragment(
    ", count(DISTINCT CASE WHEN e.visitor_id IN (SELECT e2.visitor_id FROM events e2"
    " WHERE e2.site_id = ? AND e2.ts >= ? AND e2.ts < ?{goal_of_e2})"
    " THEN e.visitor_id END), count(*) FILTER (WHERE true{goal})",
    probe="SELECT 1{} FROM events e")
_CUSTOM_EVENTS_ONLY = fragment(" AND e.name <> 'pageview'", probe=_EVENT_PROBE)
_BREAKDOWN_COLUMNS = {
    **{by: fragment(column, probe="SELECT {} FROM sessions s")
       for by, column in BREAKDOWN_SESSION_COLUMNS.items()},
    **{by: fragment(column, probe="SELECT {} FROM events e")
       for by, column in BREAKDOWN_EVENT_COLUMNS.items()},
}
_WITH_A_GOAL = {"goal_columns": _SESSION_GOAL_COLUMNS,
                "goal_join": _BUCKET_GOAL_JOIN.format(goal=_GOAL_CLAUSES["page"]),
                "matching_join": _BUCKET_MATCHING.format(event_where=_CLAUSES["page"]["=="]),
                "session_where": _CLAUSES["channel"]["!="]}

_BUCKET_EVENTS = template(
    "SELECT (e.ts - ?) / ? AS bucket, count(*) FILTER (WHERE e.name = 'pageview'),"
    " count(*) FILTER (WHERE e.name <> 'pageview')"
    " FROM events e{session_join}"
    " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ? AND e.name <> '$identify'"
    "{session_where}{event_where} GROUP BY bucket",
    {}, {"session_join": _SESSION_JOIN, "session_where": _CLAUSES["channel"]["=="],
         "event_where": _CLAUSES["prop"]["!="]})
_BUCKET_SESSIONS = template(
    "SELECT (s.started_at - ?) / ? AS bucket, count(DISTINCT s.visitor_id), count(*),"
    " count(*) FILTER (WHERE s.pageviews = 1 AND s.custom_events = 0),"
    " coalesce(sum(s.last_seen_at - s.started_at), 0){goal_columns}"
    ", coalesce(sum(s.pageviews), 0), coalesce(sum(s.custom_events), 0)"
    " FROM sessions s{goal_join}{matching_join}"
    " WHERE s.site_id = ? AND s.started_at >= ? AND s.started_at < ?{session_where}"
    " GROUP BY bucket",
    {"goal_columns": _NO_GOAL_COLUMNS}, _WITH_A_GOAL)
_SESSION_VALUES = template(
    "SELECT {column}, count(DISTINCT s.visitor_id), sum(s.pageviews),"
    " sum(s.custom_events){goal_columns} FROM sessions s{goal_join}"
    " WHERE s.site_id = ? AND s.started_at >= ? AND s.started_at < ?{session_where}{matching}"
    " GROUP BY {column}",
    {"column": _BREAKDOWN_COLUMNS["source"], "goal_columns": _NO_GOAL_COLUMNS},
    {"column": _BREAKDOWN_COLUMNS["channel"], "goal_columns": _SESSION_GOAL_COLUMNS,
     "goal_join": _GOAL_JOIN.format(goal=_GOAL_CLAUSES["event"]),
     "matching": _MATCHING_SESSIONS.format(event_where=_CLAUSES["page"]["=="]),
     "session_where": _CLAUSES["medium"]["=="]})
_EVENT_VALUES = template(
    "SELECT {column}, count(DISTINCT e.visitor_id),"
    " count(*) FILTER (WHERE e.name = 'pageview'),"
    " count(*) FILTER (WHERE e.name <> 'pageview'){goal_columns}"
    " FROM events e{session_join}"
    " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ? AND e.name <> '$identify'"
    "{session_where}{event_where}{custom_events_only} GROUP BY {column}",
    {"column": _BREAKDOWN_COLUMNS["page"], "goal_columns": _NO_GOAL_COLUMNS},
    {"column": _BREAKDOWN_COLUMNS["event"], "session_join": _SESSION_JOIN,
     "session_where": _CLAUSES["source"]["=="], "custom_events_only": _CUSTOM_EVENTS_ONLY,
     "goal_columns": _EVENT_GOAL_COLUMNS.format(goal_of_e2=_GOAL_CLAUSES_OF_E2["page"],
                                                goal=_GOAL_CLAUSES["page"])})

# The same without a goal, for several days in one statement: each event counts in the day
# it is dated (the first parameter is the first day's start), as a statement a day would
# count it. One pass over the range instead of one a day: on PostgreSQL with statistics a
# day's statement hash-joins every session of the site (docs/perf-notes.md).
_EVENT_VALUES_BY_DAY = template(
    "SELECT (e.ts - ?) / 86400000 AS day, {column}, count(DISTINCT e.visitor_id),"
    " count(*) FILTER (WHERE e.name = 'pageview'),"
    " count(*) FILTER (WHERE e.name <> 'pageview')"
    " FROM events e{session_join}"
    " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ? AND e.name <> '$identify'"
    "{session_where}{event_where}{custom_events_only} GROUP BY day, {column}",
    {"column": _BREAKDOWN_COLUMNS["page"]},
    {"column": _BREAKDOWN_COLUMNS["event"], "session_join": _SESSION_JOIN,
     "session_where": _CLAUSES["source"]["=="], "custom_events_only": _CUSTOM_EVENTS_ONLY})


class Segment:
    """The statements of one segment (built once per report from declared fragments)."""

    def __init__(self, filters: tuple[Filter, ...], goal: Goal | None):
        self.filters = filters
        self.goal = goal
        self.session_where = _where(tuple(f for f in filters if f.is_session))
        self.event_where = _where(tuple(f for f in filters if not f.is_session))
        self.needs_session_join = bool(self.session_where.sql)
        self.events_params = self.session_where.params + self.event_where.params
        self._slots = {
            "session_join": _SESSION_JOIN if self.needs_session_join else EMPTY,
            "session_where": self.session_where.sql,
            "event_where": self.event_where.sql,
        }
        self.matching = (_MATCHING_SESSIONS.format(event_where=self.event_where.sql)
                          if self.event_where.sql else EMPTY)
        self._goal_join = (_GOAL_JOIN.format(goal=_GOAL_CLAUSES[goal.kind])
                           if goal is not None else EMPTY)

    def _sessions_params(self, site_id: int, t0: int, t1: int) -> tuple:
        params = (site_id, t0, t1, *self.session_where.params)
        if self.event_where.sql:
            params += (site_id, t0, t1 + DAY_MS, *self.event_where.params)
        return params

    def sessions_params(self, site_id: int, t0: int, t1: int) -> tuple:
        """The parameters of `sessions_where` for the sessions started in [t0, t1)."""
        return self._sessions_params(site_id, t0, t1)

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
                    _BUCKET_EVENTS.fill(**self._slots),
                    (start, width, site_id, start, end, *self.events_params)):
                event_counts[bucket] = (pageviews, events)
        window = (start, end, *(start, width) * 4, 1 + DAY_MS // width)
        goal_params = (site_id, start, end + DAY_MS, self.goal.name, *window) if self.goal else ()
        matching_params = ((site_id, start, end + DAY_MS, *self.event_where.params, *window)
                           if self.event_where.sql else ())
        rows = conn.execute(
            _BUCKET_SESSIONS.fill(
                goal_columns=_SESSION_GOAL_COLUMNS if self.goal else _NO_GOAL_COLUMNS,
                goal_join=(_BUCKET_GOAL_JOIN.format(goal=_GOAL_CLAUSES[self.goal.kind])
                           if self.goal else EMPTY),
                matching_join=(_BUCKET_MATCHING.format(event_where=self.event_where.sql)
                               if self.event_where.sql else EMPTY),
                session_where=self.session_where.sql),
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
            rows = conn.execute(
                _SESSION_VALUES.fill(
                    column=_BREAKDOWN_COLUMNS[by],
                    goal_columns=_SESSION_GOAL_COLUMNS if self.goal else _NO_GOAL_COLUMNS,
                    goal_join=self._goal_join, session_where=self.session_where.sql,
                    matching=self.matching),
                (*self._goal_params(site_id, t0, t1), *self._sessions_params(site_id, t0, t1)))
        else:
            goal_columns, goal_params = _NO_GOAL_COLUMNS, ()
            if self.goal is not None:
                goal_columns = _EVENT_GOAL_COLUMNS.format(
                    goal_of_e2=_GOAL_CLAUSES_OF_E2[self.goal.kind],
                    goal=_GOAL_CLAUSES[self.goal.kind])
                goal_params = (site_id, t0, t1 + DAY_MS, self.goal.name, self.goal.name)
            rows = conn.execute(
                _EVENT_VALUES.fill(
                    column=_BREAKDOWN_COLUMNS[by], goal_columns=goal_columns,
                    custom_events_only=_CUSTOM_EVENTS_ONLY if by == "event" else EMPTY,
                    **self._slots),
                (*goal_params, site_id, t0, t1, *self.events_params))
        return [SegmentCount(value, visitors, pageviews or 0, events or 0, conversions,
                             goal_events)
                for value, visitors, pageviews, events, conversions, goal_events in rows]

    def counts_by_day(self, by: str) -> bool:
        """Whether values_by_day counts `by` for this segment (an event dimension, no goal)."""
        return by in BREAKDOWN_EVENT_COLUMNS and self.goal is None

    def values_by_day(self, conn: Connection, site_id: int, first: int, last: int,
                      by: str) -> dict[int, list[SegmentCount]]:
        """`values` of each day first..last (day numbers since 1970), in one statement."""
        t0, t1 = first * DAY_MS, (last + 1) * DAY_MS
        rows = conn.execute(
            _EVENT_VALUES_BY_DAY.fill(
                column=_BREAKDOWN_COLUMNS[by],
                custom_events_only=_CUSTOM_EVENTS_ONLY if by == "event" else EMPTY,
                **self._slots),
            (t0, site_id, t0, t1, *self.events_params))
        days: dict[int, list[SegmentCount]] = {day: [] for day in range(first, last + 1)}
        for day, value, visitors, pageviews, events in rows:
            days[first + day].append(SegmentCount(value, visitors, pageviews or 0, events or 0))
        return days


# A segment's final days, stored (reports.segments.segment_days): the segments a site
# keeps, and per segment the figures of each stored day, dimension and value.
_REGISTER = statement(
    "INSERT INTO traffic_segments (site_id, segment, created_at)"
    " SELECT ?1, ?2, ?3 WHERE (SELECT count(*) FROM traffic_segments WHERE site_id = ?1) < ?4"
    " ON CONFLICT DO NOTHING"
)
_REGISTERED = statement("SELECT 1 FROM traffic_segments WHERE site_id = ? AND segment = ?")
_STORED_TOTALS = statement(
    "SELECT day, visitors, pageviews, sessions, events, bounces, duration_ms, conversions,"
    " goal_events FROM traffic_segment_days"
    " WHERE site_id = ? AND segment = ? AND day >= ? AND day <= ?"
)
_STORE_TOTALS = statement(
    "INSERT INTO traffic_segment_days (site_id, segment, day, visitors, pageviews, sessions,"
    " events, bounces, duration_ms, conversions, goal_events)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_STORED_DIMENSION_DAYS = statement(
    "SELECT day FROM traffic_segment_dimensions"
    " WHERE site_id = ? AND segment = ? AND dimension = ? AND day >= ? AND day <= ?"
)
_STORED_VALUES = statement(
    "SELECT value, sum(visitors), sum(pageviews), sum(events), sum(conversions),"
    " sum(goal_events) FROM traffic_segment_values"
    " WHERE site_id = ? AND segment = ? AND dimension = ? AND day >= ? AND day <= ?"
    " GROUP BY value"
)
_STORE_DIMENSION = statement(
    "INSERT INTO traffic_segment_dimensions (site_id, segment, dimension, day)"
    " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_STORE_VALUE = statement(
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
