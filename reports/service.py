"""Each report by name: check its parameters, then run its queries for one site.

The endpoints and `tally report` both come through here, so they take the same
parameters, refuse the same values with the same messages and return the same data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from reports import assembly
from reports.funnels.funnel import funnel
from reports.funnels.steps import check_steps, parse_steps
from reports.money.amounts import exact_decimals
from reports.money.revenue_by import REVENUE_DIMENSIONS
from reports.segments.filters import parse_compare, parse_filters, parse_goal
from reports.shared.params import (
    InvalidReportParameter,
    check_known,
    parse_at,
    parse_choice,
    parse_date_range,
    parse_dimension,
    parse_limit,
    utc_today,
)
from reports.timeseries import parse_interval
from storage.db import Database
from storage.funnels import Funnels

Params = Mapping[str, object]
RANGE = ("from", "to")


def _revenue(db: Database, site_id: int, params: Params, now: float, stores: bool) -> dict:
    check_known(params, (*RANGE, "by", "filters", "compare"))
    period = parse_date_range(params, utc_today(now))
    by = parse_choice(params, "by", REVENUE_DIMENSIONS, "channel")
    query, compare = _query(db, site_id, params, now, stores, goal=False), parse_compare(params)
    return assembly.with_comparison(lambda p: assembly.revenue(query, p, by), period, compare)


def _mrr(db: Database, site_id: int, params: Params, now: float, stores: bool) -> dict:
    check_known(params, ("at", "filters"))
    at = parse_at(params, utc_today(now))
    return assembly.mrr(_query(db, site_id, params, now, stores, goal=False), at)


def _movements(db: Database, site_id: int, params: Params, now: float, stores: bool) -> dict:
    check_known(params, (*RANGE, "filters"))
    period = parse_date_range(params, utc_today(now))
    return assembly.movements(_query(db, site_id, params, now, stores, goal=False), period)


def _query(db: Database, site_id: int, params: Params, now: float, stores: bool,
           goal: bool = True) -> assembly.Query:
    return assembly.Query(db, site_id, int(now * 1000), parse_filters(params),
                           parse_goal(params) if goal else None, stores_segments=stores)


def _aggregate(db: Database, site_id: int, params: Params, now: float, stores: bool) -> dict:
    check_known(params, (*RANGE, "filters", "goal", "compare"))
    period = parse_date_range(params, utc_today(now))
    query, compare = _query(db, site_id, params, now, stores), parse_compare(params)
    return assembly.with_comparison(
        lambda p: assembly.aggregate_figures(query, p), period, compare)


def _breakdown(db: Database, site_id: int, params: Params, now: float, stores: bool) -> dict:
    check_known(params, ("by", "limit", *RANGE, "filters", "goal"))
    by, limit = parse_dimension(params), parse_limit(params)
    period = parse_date_range(params, utc_today(now))
    return assembly.breakdown(_query(db, site_id, params, now, stores), period, by, limit)


def _timeseries(db: Database, site_id: int, params: Params, now: float, stores: bool) -> dict:
    check_known(params, (*RANGE, "interval", "filters", "goal", "compare"))
    period = parse_date_range(params, utc_today(now))
    interval = parse_interval(params, period)
    query, compare = _query(db, site_id, params, now, stores), parse_compare(params)
    return assembly.timeseries_compared(query, period, interval, compare)


def _goals(db: Database, site_id: int, params: Params, now: float, stores: bool) -> dict:
    check_known(params, (*RANGE, "filters", "limit"))
    period = parse_date_range(params, utc_today(now))
    query = _query(db, site_id, params, now, stores, goal=False)
    return assembly.goals(query, period, parse_limit(params))


def _realtime(db: Database, site_id: int, params: Params, now: float,
              max_delay_seconds: float) -> dict:
    check_known(params, ())
    return assembly.realtime(db, site_id, int(now * 1000), max_delay_seconds)


def _funnel(db: Database, site_id: int, params: Params, now: float, stores: bool) -> dict:
    check_known(params, ("steps", "funnel", *RANGE, "filters"))
    period = parse_date_range(params, utc_today(now))
    filters = parse_filters(params)
    steps, name = parse_steps(params), params.get("funnel")
    if (steps is None) == (name is None):
        raise InvalidReportParameter(
            "steps: give steps (2 to 8, separated by commas, each page:/PATH, goal:NAME or"
            " payment) or funnel (the name of a stored funnel), one of them")
    head = {"from": period.start.isoformat(), "to": period.end.isoformat()}
    if filters:
        head["filters"] = ";".join(f.text() for f in filters)
    if name is not None:
        stored = Funnels(db, lambda: now).find(site_id, str(name))
        if stored is None:
            raise InvalidReportParameter(f"funnel: this site has no funnel named {name!r}")
        steps, head["funnel"] = check_steps(stored["steps"]), stored["name"]
    return {**head, **funnel(db, site_id, period, steps, filters)}


def too_expensive(seconds: float) -> str:
    """What a report stopped by its read budget (storage.db.ReadBudgetExceeded) answers."""
    return (f"this report needs more than the {seconds:g} s a read may take"
            " (TALLY_READ_BUDGET) and was stopped; narrow it: a shorter range (from, to),"
            " fewer filters, or fewer values per filter")


Report = Callable[[Database, int, Params, float, bool], dict]
REPORTS: dict[str, Report] = {
    "revenue": _revenue,
    "mrr": _mrr,
    "movements": _movements,
    "aggregate": _aggregate,
    "breakdown": _breakdown,
    "timeseries": _timeseries,
    "goals": _goals,
    "realtime": _realtime,  # takes max_delay_seconds instead of stores
    "funnel": _funnel,
}


def run_report(name: str, db: Database, site_id: int, params: Params, now: float,
               max_delay_seconds: float = 1.0, *, stores_segments: bool = True) -> dict:
    """The report's data at unix time `now`; InvalidReportParameter when a parameter is
    unknown or bad. `max_delay_seconds` (the flush interval: how late stored events can
    be) is shown by the realtime report. `stores_segments`: False for an anonymous viewer
    (a shared link), whose filters are counted live or read from segments already stored,
    never stored anew (reports.segments.segment_days). Decimal arithmetic in any report is exact or
    raises, whatever the thread's default context (which would round at 28 digits)."""
    with exact_decimals():
        if name == "realtime":
            return _realtime(db, site_id, params, now, max_delay_seconds)
        return REPORTS[name](db, site_id, params, now, stores_segments)
