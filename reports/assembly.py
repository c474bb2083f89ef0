"""Traffic and revenue reports with filters, goals, comparisons and time series.

Each function reads through reports.days and reports.segments (traffic per day, stored
once final), reports.money.queries and reports.traffic.queries, and gives the figures their
shape with the pure functions of reports.traffic, reports.money and reports.timeseries.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from itertools import zip_longest

from reports.days.queries import DIMENSIONS as STORED_DIMENSIONS
from reports.days.traffic_days import TrafficDays
from reports.money.mrr import mrr_at, mrr_movements
from reports.money.mrr_series import CustomersOnly
from reports.money.queries import (
    SqlSubscriptions,
    converted_customers,
    first_charges,
    first_touches,
    mrr_yearly_at,
    payments_by_bucket,
    plans,
    revenue_rows,
)
from reports.money.revenue import revenue_by_currency
from reports.money.revenue_by import ValueTraffic, paying_by_value, revenue_by_value
from reports.segments.filters import Filter, Goal, comparison_range, touch_matches
from reports.segments.goals import goal_rows
from reports.segments.queries import SegmentCount
from reports.segments.segment_days import SegmentDays
from reports.shared.params import DAY_MS, DateRange, end_of_day_ms
from reports.timeseries import (
    HOUR_MS,
    buckets,
    change,
    goal_figures,
    revenue_per_bucket,
    sum_totals,
    traffic_figures,
)
from reports.traffic.queries import realtime_counts
from reports.traffic.realtime import (
    MINUTE_MS,
    REALTIME_MINUTES,
    REALTIME_VISITOR_MINUTES,
    realtime_view,
)
from storage.db import Database


class Query:
    """The parameters every traffic report shares."""

    def __init__(self, db: Database, site_id: int, now_ms: int,
                 filters: tuple[Filter, ...] = (), goal: Goal | None = None,
                 stores_segments: bool = True):
        self.db = db
        self.site_id = site_id
        self.now_ms = now_ms
        self.filters = filters
        self.goal = goal
        # False for an anonymous viewer: segments are read if stored, never stored.
        self.stores_segments = stores_segments

    @property
    def plain(self) -> bool:
        return not self.filters and self.goal is None

    def days(self) -> TrafficDays:
        if self.plain:
            return TrafficDays(self.db, self.site_id, self.now_ms)
        return self.segment_days()

    def segment_days(self, filters: tuple[Filter, ...] | None = None,
                     goal: Goal | None = None) -> SegmentDays:
        """The query's segment, or one of other filters (and goal)."""
        if filters is None:
            filters, goal = self.filters, self.goal
        return SegmentDays(self.db, self.site_id, self.now_ms, filters, goal,
                           stores=self.stores_segments)

    def header(self, period: DateRange) -> dict:
        head = {"from": period.start.isoformat(), "to": period.end.isoformat()}
        if self.filters:
            head["filters"] = ";".join(f.text() for f in self.filters)
        if self.goal:
            head["goal"] = self.goal.text()
        return head

    def header_filters(self) -> dict:
        return {"filters": ";".join(f.text() for f in self.filters)} if self.filters else {}

    def customer_filter(self, touches: dict | None = None) -> Callable[[str], bool] | None:
        """Which customers count on revenue figures: those whose first touch passes."""
        if not self.filters:
            return None
        if touches is None:
            touches = first_touches(self.db.conn(), self.site_id)
        without = touch_matches(self.filters, None)
        return lambda customer: (touch_matches(self.filters, touches[customer])
                                 if customer in touches else without)


def aggregate_figures(query: Query, period: DateRange) -> dict:
    totals = sum_totals(query.days().day_totals(period).values())
    return {**query.header(period), **traffic_figures(totals, query.goal is not None)}


def with_comparison(figures: Callable[[DateRange], dict], period: DateRange,
                    compare: str | None) -> dict:
    """The figures of the range, and with `compare` those of the comparison range under
    "compare" and their change under "change"."""
    main = figures(period)
    if compare is None:
        return main
    other = figures(comparison_range(period, compare))
    return {**main, "compare": other, "change": change(main, other)}


def breakdown_rows(counts: list[SegmentCount], limit: int, with_goal: bool) -> list[dict]:
    """Sorted by visitors (most first), then value (a missing value last)."""
    ordered = sorted(counts, key=lambda c: (-c.visitors, c.value is None, c.value or ""))
    rows = []
    for c in ordered[:limit]:
        row = {"value": c.value, "visitors": c.visitors, "pageviews": c.pageviews,
               "events": c.events}
        if with_goal:
            row.update(goal_figures(c.conversions, c.visitors, c.goal_events))
        rows.append(row)
    return rows


def breakdown(query: Query, period: DateRange, by: str, limit: int) -> dict:
    """Filters only on the breakdown's own dimension keep or drop whole rows, so the rows
    of the plain breakdown (stored days) answer them; other filters count a segment."""
    if query.goal is None and query.filters and all(f.dimension == by for f in query.filters):
        plain = (TrafficDays(query.db, query.site_id, query.now_ms) if by in STORED_DIMENSIONS
                 else query.segment_days((), None)).values(period, by)
        counts = [c for c in plain if touch_matches(query.filters, {by: c.value})]
    elif by not in STORED_DIMENSIONS:
        # The UTM dimensions are not kept per day with the site's traffic: the unfiltered
        # segment ("*") keeps them, so they too are counted once a day is final.
        counts = query.segment_days().values(period, by)
    else:
        counts = query.days().values(period, by)
    return {**query.header(period), "by": by,
            "rows": breakdown_rows(counts, limit, query.goal is not None)}


def timeseries(query: Query, period: DateRange, interval: str) -> dict:
    bucket_list = buckets(period, interval)
    if interval == "hour":
        hours = query.segment_days().hour_totals(period)
        traffic = [hours[b.start_ms // HOUR_MS] for b in bucket_list]
    else:
        per_day = query.days().day_totals(period)
        traffic = [sum_totals(per_day[d] for d in b.days) for b in bucket_list]
    conn = query.db.conn()
    width = HOUR_MS if interval == "hour" else DAY_MS
    revenue = revenue_per_bucket(
        bucket_list,
        payments_by_bucket(conn, query.site_id, period.start_ms, period.end_ms, width),
        first_charges(conn, query.site_id),
        mrr_yearly_at(conn, query.site_id, [b.end_ms for b in bucket_list]),
        query.customer_filter())
    rows = [{"start": b.label, **traffic_figures(t, query.goal is not None), "revenue": r}
            for b, t, r in zip(bucket_list, traffic, revenue, strict=True)]
    return {**query.header(period), "interval": interval, "rows": rows}


def timeseries_compared(query: Query, period: DateRange, interval: str,
                        compare: str | None) -> dict:
    """The series, and with `compare` the comparison range's series under "compare" and,
    bucket by bucket in order, the change of each figure under "change"."""
    main = timeseries(query, period, interval)
    if compare is None:
        return main
    other = timeseries(query, comparison_range(period, compare), interval)
    changes = [change(now, before or {}) for now, before in
               zip_longest(main["rows"], other["rows"][:len(main["rows"])])]
    return {**main, "compare": other, "change": changes}


def value_visitors(query: Query, period: DateRange, by: str) -> dict[str | None, int]:
    """Visitors per value of a dimension over the range, with the query's filters."""
    if not query.filters and by in STORED_DIMENSIONS:
        counts = TrafficDays(query.db, query.site_id, query.now_ms).values(period, by)
    else:
        counts = query.segment_days(query.filters, None).values(period, by)
    return {c.value: c.visitors for c in counts}


def revenue(query: Query, period: DateRange, by: str) -> dict:
    """Revenue per currency (figures, `by_channel` as ever, and `rows` by `by`), counting
    the customers whose first touch passes the filters."""
    conn = query.db.conn()
    touches = first_touches(conn, query.site_id)
    keep = query.customer_filter(touches) or (lambda customer: True)
    rows = [r for r in revenue_rows(conn, query.site_id, period.start_ms, period.end_ms)
            if keep(r.customer_id)]
    currencies = revenue_by_currency(rows, {c: t["channel"] for c, t in touches.items()})
    if by == "plan":
        customer_plans = plans(conn, query.site_id)
        values = {r.customer_id: customer_plans.get(r.customer_id) for r in rows}
        traffic: dict = {}
    else:
        values = {customer: touch[by] for customer, touch in touches.items()}
        first_touched = {c: values[c] for c, t in touches.items()
                         if period.start_ms <= t["started_at"] < period.end_ms and keep(c)}
        paying = paying_by_value(first_touched, first_charges(conn, query.site_id))
        visitors = value_visitors(query, period, by)
        traffic = {v: ValueTraffic(visitors.get(v, 0), paying.get(v, {}))
                   for v in visitors.keys() | paying.keys()}
    by_value = revenue_by_value(rows, values, traffic)
    for currency, figures in currencies.items():
        figures["rows"] = by_value[currency]
    return {**query.header(period), "by": by, "currencies": currencies}


def goals(query: Query, period: DateRange, limit: int) -> dict:
    """Each custom event as a goal, with the net revenue of the customers who converted."""
    counts = query.days().values(period, "event")
    visitors = sum_totals(query.days().day_totals(period).values()).visitors
    conn = query.db.conn()
    if not any(c.value is not None for c in counts):
        return {**query.header(period), "visitors": visitors, "goals": []}
    converted = converted_customers(conn, query.site_id, period.start_ms, period.end_ms)
    keep = query.customer_filter()
    if keep is not None:
        converted = {name: {c for c in customers if keep(c)}
                     for name, customers in converted.items()}
    payments = revenue_rows(conn, query.site_id, period.start_ms, period.end_ms)
    return {**query.header(period), "visitors": visitors,
            "goals": goal_rows(counts, visitors, converted, payments, limit)}


def realtime(db: Database, site_id: int, now_ms: int, max_delay_seconds: float) -> dict:
    since = now_ms - now_ms % MINUTE_MS - (REALTIME_MINUTES - 1) * MINUTE_MS
    visitors, minutes, pages, sources = realtime_counts(
        db.conn(), site_id, now_ms - REALTIME_VISITOR_MINUTES * MINUTE_MS, since)
    return realtime_view(now_ms, visitors, minutes, pages, sources, max_delay_seconds)


def mrr(query: Query, at: date) -> dict:
    """MRR at the end of `at`, counting the customers whose first touch passes the filters."""
    source = SqlSubscriptions(query.db.conn(), query.site_id)
    keep = query.customer_filter()
    filtered = source if keep is None else CustomersOnly(source, keep)
    filtered.states_at(end_of_day_ms(at))  # read now (kept), so the channels are known
    return {"at": at.isoformat(), **query.header_filters(),
            "currencies": mrr_at(filtered, at, source.channels)}


def movements(query: Query, period: DateRange) -> dict:
    source = SqlSubscriptions(query.db.conn(), query.site_id)
    keep = query.customer_filter()
    filtered = source if keep is None else CustomersOnly(source, keep)
    return {**query.header(period), "currencies": mrr_movements(filtered, period)}
