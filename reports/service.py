"""Each report by name: check its parameters, then run its queries for one site.

The endpoints and `tally report` both come through here, so they take the same
parameters, refuse the same values with the same messages and return the same data.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from datetime import date

from reports import queries
from reports.params import (
    check_known,
    parse_at,
    parse_date_range,
    parse_dimension,
    parse_limit,
)

Params = Mapping[str, object]
RANGE = ("from", "to")


def _revenue(conn: sqlite3.Connection, site_id: int, params: Params, today: date) -> dict:
    check_known(params, RANGE)
    return queries.revenue(conn, site_id, parse_date_range(params, today))


def _mrr(conn: sqlite3.Connection, site_id: int, params: Params, today: date) -> dict:
    check_known(params, ("at",))
    return queries.mrr(conn, site_id, parse_at(params, today))


def _movements(conn: sqlite3.Connection, site_id: int, params: Params, today: date) -> dict:
    check_known(params, RANGE)
    return queries.movements(conn, site_id, parse_date_range(params, today))


def _aggregate(conn: sqlite3.Connection, site_id: int, params: Params, today: date) -> dict:
    check_known(params, RANGE)
    return queries.aggregate(conn, site_id, parse_date_range(params, today))


def _breakdown(conn: sqlite3.Connection, site_id: int, params: Params, today: date) -> dict:
    check_known(params, ("by", "limit", *RANGE))
    by, limit = parse_dimension(params), parse_limit(params)
    return queries.breakdown(conn, site_id, parse_date_range(params, today), by, limit)


Report = Callable[[sqlite3.Connection, int, Params, date], dict]
REPORTS: dict[str, Report] = {
    "revenue": _revenue,
    "mrr": _mrr,
    "movements": _movements,
    "aggregate": _aggregate,
    "breakdown": _breakdown,
}


def run_report(name: str, conn: sqlite3.Connection, site_id: int, params: Params,
               today: date) -> dict:
    """The report's data; InvalidReportParameter when a parameter is unknown or bad."""
    return REPORTS[name](conn, site_id, params, today)
