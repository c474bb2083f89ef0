"""Traffic and revenue reports with filters, goals, comparisons and time series.

Each function reads through reports.days / reports.segments (traffic per day, stored once
final) and reports.revenue_queries, and gives the figures their shape with the pure
functions of reports.traffic and reports.timeseries.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import zip_longest

from reports.days import TrafficDays
from reports.filters import Filter, Goal, comparison_range, touch_matches
from reports.params import DAY_MS, DateRange
from reports.revenue_queries import first_charges, first_touches, mrr_yearly_at, payments_by_bucket
from reports.segment_queries import SegmentCount
from reports.segments import SegmentDays
from reports.timeseries import (
    HOUR_MS,
    buckets,
    change,
    goal_figures,
    revenue_per_bucket,
    sum_totals,
    traffic_figures,
)
from storage.db import Database


class Query:
    """The parameters every traffic report shares."""

    def __init__(self, db: Database, site_id: int, now_ms: int,
                 filters: tuple[Filter, ...] = (), goal: Goal | None = None):
        self.db = db
        self.site_id = site_id
        self.now_ms = now_ms
        self.filters = filters
        self.goal = goal

    @property
    def plain(self) -> bool:
        return not self.filters and self.goal is None

    def days(self) -> TrafficDays:
        if self.plain:
            return TrafficDays(self.db, self.site_id, self.now_ms)
        return SegmentDays(self.db, self.site_id, self.now_ms, self.filters, self.goal)

    def segment_days(self) -> SegmentDays:
        return SegmentDays(self.db, self.site_id, self.now_ms, self.filters, self.goal)

    def header(self, period: DateRange) -> dict:
        head = {"from": period.start.isoformat(), "to": period.end.isoformat()}
        if self.filters:
            head["filters"] = ";".join(f.text() for f in self.filters)
        if self.goal:
            head["goal"] = self.goal.text()
        return head

    def customer_filter(self) -> Callable[[str], bool] | None:
        """Which customers count on revenue figures: those whose first touch passes."""
        if not self.filters:
            return None
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
    counts = query.days().values(period, by)
    return {**query.header(period), "by": by,
            "rows": breakdown_rows(counts, limit, query.goal is not None)}


def timeseries(query: Query, period: DateRange, interval: str) -> dict:
    bucket_list = buckets(period, interval)
    if interval == "hour":
        days = query.segment_days()
        traffic = [days.count_totals(b.start_ms, b.end_ms) for b in bucket_list]
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
