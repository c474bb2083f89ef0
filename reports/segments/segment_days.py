"""Filtered traffic (a segment) per UTC day, stored once a day is final, like reports.days.traffic_days.

A segment is a set of filters with an optional goal (reports.segments.filters.segment_key). Its
final days are counted once and kept in traffic_segment_days / traffic_segment_values;
recent days are counted live. A site keeps at most MAX_STORED_SEGMENTS segments: past
that, a new segment is counted live each time (still right, only slower), so no caller
can fill the disk with endless distinct filters. A report that must not spend that budget
(an anonymous viewer's: `stores=False`) reads the segment's stored days, if any, counts
the rest live and stores nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from reports.days.traffic_days import TrafficDays, day_bounds
from reports.segments import queries
from reports.segments.filters import Filter, Goal, segment_key
from reports.segments.queries import Segment, SegmentCount, SegmentTotals, resolve
from reports.shared.params import DAY_MS, DateRange
from storage.connection import Connection
from storage.db import Database

MAX_STORED_SEGMENTS = 200
# Filter values and goal names hold no control character, so no segment key ends so.
HOURS_SUFFIX = "\x1fhour"
HOUR_MS = 3_600_000

def merge_counts(counts: Iterable[SegmentCount]) -> list[SegmentCount]:
    merged: dict[str | None, list[int]] = defaultdict(lambda: [0] * 5)
    for count in counts:
        sums = merged[count.value]
        for i, figure in enumerate(count[1:]):
            sums[i] += figure
    return [SegmentCount(value, *sums) for value, sums in merged.items()]


class SegmentDays(TrafficDays):
    """A segment's traffic over whole days: stored final days read back, the rest counted."""

    empty = SegmentTotals()

    def __init__(self, db: Database, site_id: int, now_ms: int,
                 filters: tuple[Filter, ...], goal: Goal | None, stores: bool = True):
        super().__init__(db, site_id, now_ms)
        self.filters = filters
        self.goal = goal
        self.key = segment_key(filters, goal)
        self.stores = stores
        self._segment: Segment | None = None
        self._span = (0, 0)

    def segment(self, first: int, last: int) -> Segment:
        """The segment's statements for counting days first..last: its `~` filters
        matched against the values stored from the first day to a day after the last."""
        start, end = first * DAY_MS, (last + 2) * DAY_MS
        if self._segment is None or not self._span[0] <= start < end <= self._span[1]:
            filters = resolve(self.conn, self.site_id, self.filters, start, end)
            self._segment = Segment(filters, self.goal)
            self._span = (start, end)
        return self._segment

    def _count_runs(self, days: list[int], count: Callable[[int, int], dict[int, object]],
                    store: Callable[[Connection, int, object], None]) -> dict[int, object]:
        if days:  # match the `~` filters once, over all the days to count
            self.segment(min(days), max(days))
        return super()._count_runs(days, count, store)

    def _registered(self, conn: Connection, key: str | None = None) -> bool:
        key = key or self.key
        return queries.register_segment(conn, self.site_id, key, self.now_ms,
                                        MAX_STORED_SEGMENTS)

    def _bucket_days(self, first: int, last: int, width: int) -> dict[int, SegmentTotals]:
        """Days first..last counted in buckets of `width`, by bucket number since 1970."""
        start = first * DAY_MS
        per_bucket = self.segment(first, last).bucket_totals(
            self.conn, self.site_id, start, (last + 1) * DAY_MS, width)
        return {start // width + i: totals for i, totals in per_bucket.items()}

    def totals(self, period: DateRange) -> SegmentTotals:
        sums = [sum(column) for column in zip(*self.day_totals(period).values(), strict=True)]
        return SegmentTotals(*sums) if sums else SegmentTotals()

    def day_totals(self, period: DateRange) -> dict[int, SegmentTotals]:
        first, last = day_bounds(period)
        totals = dict.fromkeys(range(first, last + 1), self.empty)
        lo, hi = self.within_life(period)
        if lo > hi:
            return totals
        stored = queries.stored_segment_totals(self.conn, self.site_id, self.key, lo, hi)

        def count(first: int, last: int) -> dict[int, SegmentTotals]:
            days = self._bucket_days(first, last, DAY_MS)
            return {day: days.get(day, self.empty) for day in range(first, last + 1)}

        def store(conn: Connection, day: int, totals: SegmentTotals) -> None:
            if self._registered(conn):
                queries.store_segment_totals(conn, self.site_id, self.key, {day: totals})

        totals.update(stored)
        totals.update(self._count_runs(
            [day for day in range(lo, hi + 1) if day not in stored], count, store))
        return totals

    def hour_totals(self, period: DateRange) -> dict[int, SegmentTotals]:
        """Each hour's figures, by hour number (hours since 1970-01-01). A final day's 24
        hours are stored together, as rows of the segment `<key>` + HOURS_SUFFIX whose `day` column
        holds the hour number."""
        key = self.key + HOURS_SUFFIX
        first, last = day_bounds(period)
        hours = dict.fromkeys(range(first * 24, last * 24 + 24), self.empty)
        lo, hi = self.within_life(period)
        if lo > hi:
            return hours
        stored = queries.stored_segment_totals(self.conn, self.site_id, key, lo * 24,
                                               hi * 24 + 23)
        stored_days = {hour // 24 for hour in stored}

        def count(first: int, last: int) -> dict[int, dict[int, SegmentTotals]]:
            counted = self._bucket_days(first, last, HOUR_MS)
            return {day: {hour: counted.get(hour, self.empty)
                          for hour in range(day * 24, day * 24 + 24)}
                    for day in range(first, last + 1)}

        def store(conn: Connection, day: int, day_hours: dict[int, SegmentTotals]) -> None:
            if self._registered(conn, key):
                queries.store_segment_totals(conn, self.site_id, key, day_hours)

        counted = self._count_runs(
            [day for day in range(lo, hi + 1) if day not in stored_days], count, store)
        hours.update(stored)
        for day_hours in counted.values():
            hours.update(day_hours)
        return hours

    def values(self, period: DateRange, by: str) -> list[SegmentCount]:
        first, last = self.within_life(period)
        if first > last:
            return []
        with self.db.snapshot(self.conn) as conn:
            stored_days = queries.stored_segment_dimension_days(
                conn, self.site_id, self.key, by, first, last)
            stored = queries.stored_segment_values(conn, self.site_id, self.key, by, first, last)

        def count(first: int, last: int) -> dict[int, list[SegmentCount]]:
            segment = self.segment(first, last)
            if segment.counts_by_day(by):
                return segment.values_by_day(self.conn, self.site_id, first, last, by)
            return {day: segment.values(self.conn, self.site_id, day * DAY_MS,
                                        (day + 1) * DAY_MS, by)
                    for day in range(first, last + 1)}

        def store(conn: Connection, day: int, counts: list[SegmentCount]) -> None:
            if self._registered(conn):
                queries.store_segment_values(conn, self.site_id, self.key, by, day, counts)

        counted = self._count_runs(
            [day for day in range(first, last + 1) if day not in stored_days], count, store)
        return merge_counts([*stored, *(c for counts in counted.values() for c in counts)])
