"""Monthly event usage: the count each events request checks, and what `tally usage` shows.

The shared count per (account, month) lives in `monthly_usage`, incremented by the flush
in the same transaction that stores the events. The request path never writes: a worker
reads the shared count at most once a second and adds the counted events it holds but
has not stored yet.
"""

from __future__ import annotations

import calendar
import math
import re
import threading
import time
from collections.abc import Callable, Iterable

from quota.plans import PLANS
from storage.db import Database
from storage.directory import InvalidArgument, NotFound
from storage.usage import account_month, read_usage
from vocabulary import UNCOUNTED_EVENTS

MONTH_PATTERN = re.compile(r"[0-9]{4}-(0[1-9]|1[0-2])")
UsageKey = tuple[int, str]  # (account id, "YYYY-MM")


def month_bounds(now: float) -> tuple[str, int, int]:
    """("YYYY-MM", first second, first second of the next month) of a unix time, in UTC."""
    moment = time.gmtime(now)
    year, month = moment.tm_year, moment.tm_mon
    after = (year + 1, 1) if month == 12 else (year, month + 1)
    return (f"{year:04d}-{month:02d}", calendar.timegm((year, month, 1, 0, 0, 0)),
            calendar.timegm((*after, 1, 0, 0, 0)))


def month_of(now: float) -> str:
    """The UTC month of a unix time, as "YYYY-MM"."""
    return month_bounds(now)[0]


def seconds_until_next_month(now: float) -> int:
    """Whole seconds (rounded up) until 00:00 UTC on the first day of next month."""
    return max(1, math.ceil(month_bounds(now)[2] - now))


def counted_events(events: Iterable, anonymous: bool = False) -> int:
    """How many of the events count toward the monthly quota: all but a keyed `$identify`.
    Every anonymous event counts (POST /api/v1/collect): its `$identify` too."""
    if anonymous:
        return sum(1 for _ in events)
    counted = 0
    for event in events:
        if event.name not in UNCOUNTED_EVENTS:
            counted += 1
    return counted


class UtcMonths:
    """month_of() that recomputes only when `now` leaves the month it last answered for."""

    def __init__(self):
        self._month = ("", 0, 0)  # one tuple, so request threads never see a half update

    def name(self, now: float) -> str:
        month = self._month
        if not month[1] <= now < month[2]:
            month = self._month = month_bounds(now)
        return month[0]


class QuotaGuard:
    """An account's events this month as this worker sees them, and the anonymous ones."""

    def __init__(self, db: Database, clock: Callable[[], float], ttl: float = 1.0,
                 max_entries: int = 10_000, keyed_reserve_percent: int = 0):
        self.db = db
        self.clock = clock
        self.ttl = ttl
        self.keyed_reserve_percent = keyed_reserve_percent
        self._max = max_entries
        self._lock = threading.Lock()
        # key -> (expires at, count, anonymous count)
        self._shared: dict[UsageKey, tuple[float, int, int]] = {}
        self._unstored: dict[UsageKey, int] = {}
        self._unstored_anonymous: dict[UsageKey, int] = {}
        # Bumped when a flush transaction starts and when it ends: a count read from the
        # table while a flush of this worker commits could include events that are
        # still in _unstored, so such a read is not kept.
        self._epoch = 0
        self._committing = False
        # plan -> (cap, anonymous limit): fixed for the process, so not worked out per request.
        self._limits = {name: (plan.cap, plan.anonymous_limit(keyed_reserve_percent))
                        for name, plan in PLANS.items()}

    def over_cap(self, key: UsageKey, plan: str, anonymous: bool = False) -> bool:
        """Whether the account has used its plan's monthly cap (spec: 429 quota_exceeded).

        Anonymous events beyond their limit (the cap less the keyed reserve, which requests
        of several workers can pass by a flush interval's traffic) do not count against
        keyed traffic, so it always keeps the reserve. Anonymous events themselves also stop
        at that limit (`anonymous`)."""
        total, anonymous_count = self.usage(key)
        cap, limit = self._limits[plan]
        if total - max(0, anonymous_count - limit) >= cap:
            return True
        return anonymous and anonymous_count >= limit

    def used(self, key: UsageKey) -> int:
        return self.usage(key)[0]

    def usage(self, key: UsageKey) -> tuple[int, int]:
        """(counted events, anonymous ones) of the key: stored, plus held by this worker."""
        now = self.clock()
        with self._lock:
            entry = self._shared.get(key)
            if entry is not None and (entry[0] > now or self._committing):
                # While this worker's own flush commits, the count it read before stays
                # right with what it holds (the events being stored are still held), and
                # a read now could count them twice: the request never waits for the
                # commit, it uses that count until end_commit() brings the new one.
                return self._with_unstored(key, entry)
            epoch, committing = self._epoch, self._committing
        count, anonymous = read_usage(self.db.conn(), *key)
        with self._lock:
            clean = not committing and self._epoch == epoch
            if clean or entry is None:
                # A first read that raced a commit may count events twice (never fewer):
                # it is used once and read again next time.
                if len(self._shared) >= self._max:
                    self._shared.clear()
                self._shared[key] = (now + self.ttl if clean else now, count, anonymous)
            return self._with_unstored(key, self._shared[key])

    def _with_unstored(self, key: UsageKey, entry: tuple[float, int, int]) -> tuple[int, int]:
        return (entry[1] + self._unstored.get(key, 0),
                entry[2] + self._unstored_anonymous.get(key, 0))

    # The flow of counted events: held by a request, then stored by the flush. --------
    def hold(self, key: UsageKey, events: int, anonymous: int = 0) -> None:
        """`events` counted events held, `anonymous` of them anonymous."""
        if events:
            with self._lock:
                self._unstored[key] = self._unstored.get(key, 0) + events
                if anonymous:
                    self._unstored_anonymous[key] = (self._unstored_anonymous.get(key, 0)
                                                     + anonymous)

    def release(self, key: UsageKey, events: int, anonymous: int = 0) -> None:
        """Held events that did not go on the queue after all."""
        if events:
            with self._lock:
                _forget(self._unstored, key, events)
                _forget(self._unstored_anonymous, key, anonymous)

    def begin_commit(self) -> None:
        with self._lock:
            self._committing = True
            self._epoch += 1

    def end_commit(self, stored: dict[UsageKey, int] | None = None,
                   totals: dict[UsageKey, int] | None = None,
                   stored_anonymous: dict[UsageKey, int] | None = None,
                   anonymous_totals: dict[UsageKey, int] | None = None) -> None:
        """After a flush transaction: `stored` counted events (`stored_anonymous` of them
        anonymous) are now in `totals` and `anonymous_totals` (the table's counts after the
        commit); all None when the transaction failed."""
        now = self.clock()
        anonymous_totals = anonymous_totals or {}
        with self._lock:
            for key, events in (stored or {}).items():
                _forget(self._unstored, key, events)
            for key, events in (stored_anonymous or {}).items():
                _forget(self._unstored_anonymous, key, events)
            for key, total in (totals or {}).items():
                self._shared[key] = (now + self.ttl, total, anonymous_totals.get(key, 0))
            self._committing = False
            self._epoch += 1


def _forget(counts: dict[UsageKey, int], key: UsageKey, events: int) -> None:
    if not events:
        return
    left = counts.get(key, 0) - events
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


def account_usage(db: Database, account_public_id: str, month: str) -> dict:
    """What `tally usage` prints: the account's events in a month against its plan."""
    if not MONTH_PATTERN.fullmatch(month):
        raise InvalidArgument(f"--month must look like 2026-09, not {month!r}")
    row = account_month(db.conn(), account_public_id, month)
    if row is None:
        raise NotFound(f"no account {account_public_id}")
    plan = PLANS[row[0]]
    return {"account": account_public_id, "plan": plan.name, "month": month, "events": row[1],
            "allowance": plan.allowance, "cap": plan.cap}
