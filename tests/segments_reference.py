"""The statements of filtered traffic as they were before issue 26, kept as the reference
tests/test_reports_bounded.py compares today's with: one statement per bucket, and a `~`
filter or a property comparison decided by the one rule (reports.segments.filters) for
every value the site stores (`by_the_rules`), not for the span's values.

The same figures must come out of reports.segments.queries (filters matched against the
stored values once, many buckets per statement) for any data and filters.
"""

from __future__ import annotations

from typing import NamedTuple

import orjson

from reports.segments.filters import Filter, Goal, contains, prop_equal
from reports.segments.queries import SegmentCount, SegmentTotals
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
        "~": f"EXISTS (SELECT 1 FROM json_each(?) WHERE instr(lower({column}), lower(value)) > 0)",  # noqa: S608 - fixed fragments
    }


_CLAUSES = {dim: _column_clauses(col) for dim, col in {**SESSION_COLUMNS, **EVENT_COLUMNS}.items()}
# A property filter takes two parameters: the key, then the values.
_PROP_MATCH = "EXISTS (SELECT 1 FROM json_each(e.props) p WHERE p.key = ? AND "
_CLAUSES["prop"] = {
    "==": _PROP_MATCH + "CAST(p.value AS TEXT) IN (SELECT value FROM json_each(?)))",  # noqa: S608 - fixed fragments
    "!=": "NOT " + _PROP_MATCH + "CAST(p.value AS TEXT) IN (SELECT value FROM json_each(?)))",  # noqa: S608 - fixed fragments
    "~": _PROP_MATCH + "EXISTS (SELECT 1 FROM json_each(?) v"  # noqa: S608 - fixed fragments
                       " WHERE instr(lower(CAST(p.value AS TEXT)), lower(v.value)) > 0))",
}
_GOAL_CLAUSES = {"event": "e.name = ?", "page": "e.name = 'pageview' AND e.pathname = ?"}


def _all_values(conn, site_id: int, f: Filter) -> list[str]:
    if f.dimension == "prop":
        sql = ("SELECT DISTINCT CAST(p.value AS TEXT), p.value FROM events e"
               " CROSS JOIN json_each(e.props) p"
               " WHERE e.site_id = ? AND e.props IS NOT NULL AND p.key = ?")
        params = (site_id, f.prop)
    else:
        column = SESSION_COLUMNS.get(f.dimension) or EVENT_COLUMNS[f.dimension]
        table = "sessions s" if f.dimension in SESSION_COLUMNS else "events e"
        sql = f"SELECT DISTINCT {column}, 1 FROM {table} WHERE site_id = ?"  # noqa: S608 - fixed names
        params = (site_id,)
    return [row for row in conn.execute(sql, params) if row[0] is not None]


def by_the_rules(conn, site_id: int, filters: tuple[Filter, ...]) -> tuple[Filter, ...]:
    """The filters with each `~` and each property comparison decided by the one rule
    (reports.segments.filters.contains, prop_equal) for every value the site stores for the
    dimension, whatever the span: `==`/`!=` lists the rows are then tested against."""
    decided = []
    for f in filters:
        if f.operator == "~":
            kept = {v for v, *_ in _all_values(conn, site_id, f)
                    if any(contains(v, w) for w in f.values)}
            decided.append(Filter(f.dimension, "==", tuple(sorted(kept)), f.prop))
        elif f.dimension == "prop":
            kept = {text for text, value in _all_values(conn, site_id, f)
                    if any(prop_equal(value, w) for w in f.values)}
            decided.append(Filter(f.dimension, f.operator, tuple(sorted(kept)), f.prop))
        else:
            decided.append(f)
    return tuple(decided)


class Where(NamedTuple):
    sql: str  # " AND ..." fragments, or ""
    params: tuple


def _where(filters: tuple[Filter, ...]) -> Where:
    sql, params = [], []
    for f in filters:
        sql.append(_CLAUSES[f.dimension][f.operator])
        if f.dimension == "prop":
            params.append(f.prop)
        params.append(orjson.dumps(list(f.values)).decode())
    return Where("".join(" AND " + s for s in sql), tuple(params))


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

    def _sessions_params(self, site_id: int, t0: int, t1: int) -> tuple:
        params = (site_id, t0, t1, *self.session_where.params)
        if self.event_where.sql:
            params += (site_id, t0, t1 + DAY_MS, *self.event_where.params)
        return params

    def _goal_params(self, site_id: int, t0: int, t1: int) -> tuple:
        return (site_id, t0, t1 + DAY_MS, self.goal.name) if self.goal else ()

    def totals(self, conn: Connection, site_id: int, t0: int, t1: int) -> SegmentTotals:
        # With session filters only, the segment's events are its sessions' (the counts each
        # session keeps): one read of the sessions instead of a join per event.
        by_sessions = self.needs_session_join and not self.event_where.sql
        pageviews = events = 0
        if not by_sessions:
            pageviews, events = conn.execute(
                "SELECT count(*) FILTER (WHERE e.name = 'pageview'),"
                " count(*) FILTER (WHERE e.name <> 'pageview')"
                + self.events_from,  # sql-safe: built from fixed fragments in __init__
                (site_id, t0, t1, *self.events_params)).fetchone()
        goal_join = self.goal_sql or ""
        goal_columns = (", count(DISTINCT CASE WHEN g.n > 0 THEN s.visitor_id END),"
                        " coalesce(sum(g.n), 0)") if self.goal_sql else ", 0, 0"
        row = conn.execute(
            "SELECT count(DISTINCT s.visitor_id), count(*),"  # noqa: S608 - fixed fragments
            " count(*) FILTER (WHERE s.pageviews = 1 AND s.custom_events = 0),"
            " coalesce(sum(s.last_seen_at - s.started_at), 0)" + goal_columns
            + ", coalesce(sum(s.pageviews), 0), coalesce(sum(s.custom_events), 0)"
            + " FROM sessions s" + goal_join + self.sessions_where,  # sql-safe: fixed fragments
            (*self._goal_params(site_id, t0, t1), *self._sessions_params(site_id, t0, t1)),
        ).fetchone()
        visitors, sessions, bounces, duration, conversions, goal_events = row[:6]
        if by_sessions:
            pageviews, events = row[6:]
        return SegmentTotals(visitors, pageviews, sessions, events, bounces, duration,
                             conversions, goal_events)

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
