"""The SQL of funnels: the stored pathnames a `*` step matches against, the events of the
visits started in the range that are one of the steps, the customers linked to those
visits, and their succeeded charges.

Each list is one JSON parameter read with json_each, so a funnel of any steps keeps the
same statement text; the filters add the declared fragments of reports.segments.queries.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import orjson

from reports.segments.queries import Segment
from storage.connection import Connection
from storage.dialect import dialect
from storage.sessions import linked_customers, linked_sessions
from storage.statements import EMPTY, by_dialect, fragment, statement, template

# A visit's events are read up to a day after the range: a visit started in the range may
# go on past its end (as a segment's sessions do, reports.segment_queries).
_PATHS = statement(
    "SELECT DISTINCT pathname FROM events"
    " WHERE site_id = ? AND ts >= ? AND ts < ? AND name = 'pageview'"
)
# The segment's visits: its session filters, and its event filters through the sessions
# with a matching event (reports.segments.queries' fragments).
_FILTERED = fragment(
    " AND e.session_id IN (SELECT s.id FROM sessions s"
    " WHERE s.site_id = ? AND s.started_at >= ? AND s.started_at < ?{session_where}{matching})",
    probe="SELECT 1 FROM events e WHERE e.id = 1{}")
_STEP_EVENTS = template(
    "SELECT e.session_id, s.visitor_id, e.ts, e.id, e.name, e.pathname"
    " FROM events e JOIN sessions s ON s.id = e.session_id"
    " WHERE e.site_id = ? AND e.ts >= ? AND e.ts < ?"
    " AND s.site_id = ? AND s.started_at >= ? AND s.started_at < ?"
    " AND (e.name IN (SELECT value FROM json_each(?))"
    " OR (e.name = 'pageview' AND e.pathname IN (SELECT value FROM json_each(?)))){filtered}"
    " ORDER BY e.session_id, e.ts, e.id",
    {}, {"filtered": _FILTERED.format(session_where=EMPTY, matching=EMPTY)})

# The customers linked now to one of the visits' visitor ids (customer.visitor_id, or
# customer.user_id -> $identify -> visitor), by visit.
_VISIT_CUSTOMERS = by_dialect(**{name: (
    f"WITH {linked_customers(name)}, {linked_sessions()}"  # noqa: S608 - fixed fragments
    " SELECT DISTINCT v.session_id, v.customer_id FROM visits v"
    " WHERE v.session_id IN (SELECT value FROM json_each(?2))"
) for name in ("sqlite", "postgres")})
_CHARGES = statement(
    "SELECT customer_id, paid_at_ms FROM payments"
    " WHERE site_id = ? AND kind = 'charge' AND status = 'succeeded'"
    " AND paid_at_ms >= ? AND paid_at_ms < ?"
    " AND customer_id IN (SELECT value FROM json_each(?))"
)


class StepEvent(NamedTuple):
    session_id: int
    visitor_id: int
    ts: int
    id: int
    name: str
    pathname: str


def _json(values) -> str:
    return orjson.dumps(sorted(values)).decode()


def pathnames(conn: Connection, site_id: int, start: int, end: int) -> list[str]:
    """The pathnames of the pageviews dated in [start, end)."""
    return [row[0] for row in conn.execute(_PATHS, (site_id, start, end))]


def step_events(conn: Connection, site_id: int, start: int, end: int,
                names: set[str], paths: set[str], segment: Segment | None,
                reach_ms: int) -> Iterator[StepEvent]:
    """The events of the visits started in [start, end) (up to `reach_ms` after `end`)
    that are a custom event named in `names` or a pageview of a path in `paths`, visit by
    visit, each visit's in order. With a segment, only its visits (its filters)."""
    params = [site_id, start, end + reach_ms, site_id, start, end, _json(names), _json(paths)]
    filtered = EMPTY
    if segment is not None and segment.filters:
        filtered = _FILTERED.format(session_where=segment.session_where.sql,
                                    matching=segment.matching)
        params += segment.sessions_params(site_id, start, end)
    for row in conn.execute(_STEP_EVENTS.fill(filtered=filtered), params):
        yield StepEvent(*row)


def visit_customers(conn: Connection, site_id: int,
                    visits: set[int]) -> list[tuple[int, str]]:
    """(visit, customer) for each customer linked now to one of the visits' visitor ids."""
    if not visits:
        return []
    return [(int(visit), customer) for visit, customer in conn.execute(
        _VISIT_CUSTOMERS[dialect(conn)], (site_id, _json(visits)))]


def charges(conn: Connection, site_id: int, start: int, end: int,
            customers: set[str]) -> list[tuple[str, int]]:
    """(customer, paid_at_ms) of the customers' succeeded charges dated in [start, end)."""
    if not customers:
        return []
    return list(conn.execute(_CHARGES, (site_id, start, end, _json(customers))))
