"""Traffic counted per UTC day, and kept once a day can no longer change.

Visitor ids come from a salt that changes every UTC day, so a visitor id lives one day:
the visitors of a range are the sum of each day's distinct visitor ids, and every
traffic figure is a sum over days. A day's figures stop changing once no event can still
be stored for it and none of its sessions can still grow: events are stored with a `ts`
at most an hour before their receipt (validation/event.py), flushed within seconds, and a
session continues only while its visitor comes back within 30 minutes. So a day counts as
final one day after it ends (FINAL_DELAY_MS) if none of its sessions was seen in the last
two hours (OPEN_SESSION_MS); its figures are then computed once, stored in
traffic_days / traffic_day_values, and read from there ever after. Days not yet final are
counted live. Either way the SQL is the same per-day statement, so stored and live days
give the same figures.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable

from reports.days import queries
from reports.shared.params import DateRange, day_start_ms
from reports.traffic.figures import BreakdownCount, SessionTotals
from storage.connection import Connection
from storage.db import Database, StorageError
from vocabulary import DAY_MS, TS_FUTURE_MS, TS_PAST_MS

log = logging.getLogger("tally")

FINAL_DELAY_MS = DAY_MS
OPEN_SESSION_MS = 2 * 3_600_000
STORE_WAIT_MS = 200
STORE_BATCH_DAYS = 7


def day_number(ms: int) -> int:
    return ms // DAY_MS


def day_bounds(period: DateRange) -> tuple[int, int]:
    return day_number(day_start_ms(period.start)), day_number(day_start_ms(period.end))


def runs(days: list[int], longest: int) -> list[tuple[int, int]]:
    """(first, last) of each run of consecutive days, runs cut at `longest` days."""
    spans: list[tuple[int, int]] = []
    for day in sorted(days):
        if spans and day == spans[-1][1] + 1 and day - spans[-1][0] < longest:
            spans[-1] = (spans[-1][0], day)
        else:
            spans.append((day, day))
    return spans


def _merge(counts: Iterable[BreakdownCount]) -> list[BreakdownCount]:
    merged: dict[str | None, list[int]] = defaultdict(lambda: [0, 0, 0])
    for count in counts:
        sums = merged[count.value]
        sums[0] += count.visitors
        sums[1] += count.pageviews
        sums[2] += count.events
    return [BreakdownCount(value, *sums) for value, sums in merged.items()]


class TrafficDays:
    """A site's traffic over whole days: what is stored is read back, the rest is counted
    live, and the final days among those are stored for next time."""

    empty = SessionTotals()  # a day's totals without traffic
    stores = True  # whether final days counted are stored

    def __init__(self, db: Database, site_id: int, now_ms: int):
        self.db = db
        self.conn = db.conn()
        self.site_id = site_id
        self.now_ms = now_ms
        self._busy = False  # set when storing failed: this report stores nothing more
        self._life: tuple[int, int] | None = None

    def life(self) -> tuple[int, int]:
        """The first and last day that can hold the site's traffic (first > last: none)."""
        if self._life is None:
            created, first_event, first_session = queries.site_life(self.conn, self.site_id)
            starts = [t for t in (first_event, first_session) if t is not None]
            if created is not None:
                starts.append(created - TS_PAST_MS)
            last = day_number(self.now_ms + TS_FUTURE_MS)
            self._life = (day_number(min(starts)) if starts else last + 1, last)
        return self._life

    def within_life(self, period: DateRange) -> tuple[int, int]:
        """The period's first and last day cut to the site's life (first > last: none)."""
        first, last = day_bounds(period)
        born, today = self.life()
        return max(first, born), min(last, today)

    def totals(self, period: DateRange) -> SessionTotals:
        sums = [sum(column) for column in zip(*self.day_totals(period).values(), strict=True)]
        return type(self.empty)(*sums) if sums else self.empty

    def day_totals(self, period: DateRange) -> dict[int, SessionTotals]:
        """Each day's totals, by day number (days since 1970-01-01)."""
        first, last = day_bounds(period)
        totals = dict.fromkeys(range(first, last + 1), self.empty)
        lo, hi = self.within_life(period)
        if lo > hi:
            return totals
        stored = queries.stored_totals(self.conn, self.site_id, lo, hi)
        counted = self._count(
            [day for day in range(lo, hi + 1) if day not in stored],
            lambda day: queries.live_totals(self.conn, self.site_id, day),
            lambda conn, day, totals: queries.store_totals(conn, self.site_id, day, totals))
        totals.update(stored)
        totals.update(counted)
        return totals

    def values(self, period: DateRange, by: str) -> list[BreakdownCount]:
        first, last = self.within_life(period)
        if first > last:
            return []
        # One read transaction: the stored days and their values from the same snapshot.
        with self.db.snapshot(self.conn) as conn:
            stored_days = queries.stored_dimension_days(conn, self.site_id, by, first, last)
            stored = queries.stored_values(conn, self.site_id, by, first, last)

        def store(conn: Connection, day: int, counts: list[BreakdownCount]) -> None:
            queries.store_values(conn, self.site_id, day, by, counts)

        counted = self._count(
            [day for day in range(first, last + 1) if day not in stored_days],
            lambda day: queries.live_values(self.conn, self.site_id, day, by), store)
        return _merge([*stored, *(c for counts in counted.values() for c in counts)])

    def _is_final(self, day: int) -> bool:
        end = (day + 1) * DAY_MS
        if self.now_ms < end + FINAL_DELAY_MS:
            return False
        return not queries.session_open(
            self.conn, self.site_id, day * DAY_MS, end, self.now_ms - OPEN_SESSION_MS)

    def _count(self, days: list[int], count: Callable[[int], object],
               store: Callable[[Connection, int, object], None]) -> dict[int, object]:
        """Count the days live, one at a time; see _count_runs."""
        return self._count_runs(
            days, lambda first, last: {day: count(day) for day in range(first, last + 1)}, store)

    def _count_runs(self, days: list[int], count: Callable[[int, int], dict[int, object]],
                    store: Callable[[Connection, int, object], None]) -> dict[int, object]:
        """Count the days live, `count(first, last)` giving the days of a run of at most
        STORE_BATCH_DAYS consecutive ones; store the final ones after each run, so a long
        first count that is cut short (a read budget, a worker timeout) still leaves its
        progress."""
        counted: dict[int, object] = {}
        for first, last in runs(days, STORE_BATCH_DAYS):
            counted.update(count(first, last))
            if self.stores and not self._busy:
                self._store([day for day in range(first, last + 1) if self._is_final(day)],
                            counted, store)
        return counted

    def _store(self, final: list[int], counted: dict[int, object],
               store: Callable[[Connection, int, object], None]) -> None:
        """Store counted final days (another worker may have stored some already: those are
        left as they are). A busy database only defers it."""
        if not final or self._busy:
            return
        # A report never waits long for the write lock: storing can wait for the next one.
        queries.set_busy_timeout(self.conn, STORE_WAIT_MS)
        try:
            with self.db.transaction(self.conn) as conn:
                for day in final:
                    store(conn, day, counted[day])
        except StorageError as exc:
            self._busy = True
            log.info("traffic of %d final days not stored this time (%s)", len(final), exc)
        finally:
            queries.set_busy_timeout(self.conn, self.db.busy_timeout_ms)
