"""Time series and comparisons: buckets of a range, figures per bucket, and changes.

Pure functions over per-day (or per-hour) figures, so each bucket is checked by hand.
Buckets are UTC: an hour, a day, a week from Monday, a calendar month; the first and
last week or month are clipped to the range, so the buckets of a range add up to it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import NamedTuple

from reports.money.amounts import exact_decimals, ratio, round_half_up, round_money
from reports.money.revenue import RevenuePayment
from reports.segments.queries import SegmentTotals
from reports.shared.params import DateRange, InvalidReportParameter, day_start_ms
from reports.traffic.figures import SessionTotals, traffic_aggregate

INTERVALS = ("hour", "day", "week", "month")
HOUR_MS = 3_600_000
MAX_HOUR_DAYS = 31


class Bucket(NamedTuple):
    label: str  # a date (YYYY-MM-DD) or, for hours, an instant (YYYY-MM-DDTHH:00:00Z)
    start_ms: int
    end_ms: int  # exclusive
    days: tuple[int, ...]  # day numbers covered (empty for an hour)


def parse_interval(params: Mapping[str, object], period: DateRange) -> str:
    raw = params.get("interval", "day")
    if raw not in INTERVALS:
        raise InvalidReportParameter(f"interval: must be one of {', '.join(INTERVALS)}")
    if raw == "hour" and period.days > MAX_HOUR_DAYS:
        raise InvalidReportParameter(
            f"interval: hour covers at most {MAX_HOUR_DAYS} days; this range has {period.days}")
    return str(raw)


def _day_number(day: date) -> int:
    return day_start_ms(day) // 86_400_000


def buckets(period: DateRange, interval: str) -> list[Bucket]:
    if interval == "hour":
        start = period.start_ms
        return [Bucket(datetime.fromtimestamp(t / 1000, UTC).strftime("%Y-%m-%dT%H:00:00Z"),
                       t, t + HOUR_MS, ())
                for t in range(start, period.end_ms, HOUR_MS)]
    result = []
    first = period.start
    while first <= period.end:
        left = (period.end - first).days  # never step past the range (nor date.max)
        if interval == "day":
            last = first
        elif interval == "week":
            last = first + timedelta(days=min(6 - first.weekday(), left))
        elif (first.year, first.month) == (period.end.year, period.end.month):
            last = period.end
        else:
            last = date(first.year + first.month // 12, first.month % 12 + 1, 1) \
                - timedelta(days=1)
        last = min(last, period.end)
        days = tuple(range(_day_number(first), _day_number(last) + 1))
        result.append(Bucket(first.isoformat(), day_start_ms(first),
                             day_start_ms(last) + 86_400_000, days))
        if last == period.end:
            break
        first = last + timedelta(days=1)
    return result


def sum_totals(parts: Iterable[SegmentTotals | SessionTotals]) -> SegmentTotals:
    sums = [0] * len(SegmentTotals._fields)
    for part in parts:
        for i, figure in enumerate(part):
            sums[i] += figure
    return SegmentTotals(*sums)


def traffic_figures(totals: SegmentTotals, with_goal: bool) -> dict:
    """The aggregate's figures, plus with a goal `conversions` (visitors with a goal
    event), `conversion_rate` (their share of visitors) and `goal_events`."""
    figures = traffic_aggregate(SessionTotals(*totals[:6]))
    if with_goal:
        figures.update(goal_figures(totals.conversions, totals.visitors, totals.goal_events))
    return figures


def goal_figures(conversions: int, visitors: int, goal_events: int) -> dict:
    return {"conversions": conversions, "conversion_rate": ratio(conversions, visitors),
            "goal_events": goal_events}


def revenue_per_bucket(bucket_list: list[Bucket], payments: Iterable[RevenuePayment],
                       first_charges: Mapping[tuple[str, str], int],
                       mrr_yearly: Mapping[int, Mapping[tuple[str, str], Decimal]],
                       keep: Callable[[str], bool] | None = None) -> list[dict]:
    """Per bucket {currency: {"net", "new_customers", "mrr"}}.

    net: charges - refunds - chargebacks dated in the bucket; new_customers: customers whose
    first succeeded charge in the currency (`first_charges`, (customer, currency) -> ms)
    falls in the bucket; mrr: at the bucket's end (`mrr_yearly`, end ms -> (currency,
    customer) -> yearly value). `keep` says which customers count (None: all).
    Currencies with nothing over the whole range are left out of every bucket."""
    starts = [b.start_ms for b in bucket_list]

    def index(ms: int) -> int | None:
        i = bisect.bisect_right(starts, ms) - 1
        return i if i >= 0 and ms < bucket_list[i].end_ms else None

    keep = keep or (lambda customer: True)
    net = [dict() for _ in bucket_list]
    new = [dict() for _ in bucket_list]
    currencies = set()
    with exact_decimals():
        for p in payments:
            i = index(p.at_ms)
            if i is None or not keep(p.customer_id):
                continue
            sign = 1 if p.kind == "charge" else -1
            net[i][p.currency] = net[i].get(p.currency, Decimal(0)) + sign * p.amount * p.count
            currencies.add(p.currency)
        for (customer, currency), at in first_charges.items():
            i = index(at)
            if i is not None and keep(customer):
                new[i][currency] = new[i].get(currency, 0) + 1
                currencies.add(currency)
        mrr = []
        for b in bucket_list:
            sums: dict[str, Decimal] = {}
            for (currency, customer), yearly in mrr_yearly.get(b.end_ms, {}).items():
                if keep(customer) and yearly:
                    sums[currency] = sums.get(currency, Decimal(0)) + yearly
                    currencies.add(currency)
            mrr.append(sums)
    return [
        {currency: {"net": round_money(net[i].get(currency, 0), currency),
                    "new_customers": new[i].get(currency, 0),
                    "mrr": round_money(Fraction(mrr[i].get(currency, 0)) / 12, currency)}
         for currency in sorted(currencies)}
        for i in range(len(bucket_list))
    ]


RATIOS = ("bounce_rate", "conversion_rate")


def change(current, previous):
    """Relative change of each figure ((now - before) / before, four decimals; None when
    before is 0), except for ratios, whose change is now - before. Nested dicts alike."""
    if isinstance(current, dict):
        return {k: _change_of(k, v, previous.get(k) if isinstance(previous, dict) else None)
                for k, v in current.items() if not isinstance(v, (str, list))}
    return None


def _change_of(name, now, before):
    if isinstance(now, dict):
        return change(now, before or {})
    if before is None:
        before = 0
    if name in RATIOS:
        return round_half_up((Fraction(now) - Fraction(before)) * 10_000) / 10_000
    if not before:
        return None
    return round_half_up((Fraction(now) - Fraction(before)) / Fraction(before) * 10_000) / 10_000
