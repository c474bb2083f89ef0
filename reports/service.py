"""Each report by name: check its parameters, then run its queries for one site.

The endpoints and `tally report` both come through here, so they take the same
parameters, refuse the same values with the same messages and return the same data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from reports import queries
from reports.params import (
    check_known,
    parse_at,
    parse_date_range,
    parse_dimension,
    parse_limit,
    utc_today,
)
from storage.db import Database

Params = Mapping[str, object]
RANGE = ("from", "to")


def _revenue(db: Database, site_id: int, params: Params, now: float) -> dict:
    check_known(params, RANGE)
    return queries.revenue(db.conn(), site_id, parse_date_range(params, utc_today(now)))


def _mrr(db: Database, site_id: int, params: Params, now: float) -> dict:
    check_known(params, ("at",))
    return queries.mrr(db.conn(), site_id, parse_at(params, utc_today(now)))


def _movements(db: Database, site_id: int, params: Params, now: float) -> dict:
    check_known(params, RANGE)
    return queries.movements(db.conn(), site_id, parse_date_range(params, utc_today(now)))


def _aggregate(db: Database, site_id: int, params: Params, now: float) -> dict:
    check_known(params, RANGE)
    period = parse_date_range(params, utc_today(now))
    return queries.aggregate(db, site_id, period, int(now * 1000))


def _breakdown(db: Database, site_id: int, params: Params, now: float) -> dict:
    check_known(params, ("by", "limit", *RANGE))
    by, limit = parse_dimension(params), parse_limit(params)
    period = parse_date_range(params, utc_today(now))
    return queries.breakdown(db, site_id, period, by, limit, int(now * 1000))


Report = Callable[[Database, int, Params, float], dict]
REPORTS: dict[str, Report] = {
    "revenue": _revenue,
    "mrr": _mrr,
    "movements": _movements,
    "aggregate": _aggregate,
    "breakdown": _breakdown,
}


def run_report(name: str, db: Database, site_id: int, params: Params, now: float) -> dict:
    """The report's data at unix time `now`; InvalidReportParameter when a parameter is
    unknown or bad."""
    return REPORTS[name](db, site_id, params, now)
