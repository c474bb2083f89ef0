"""Monthly recurring revenue from dated subscription observations, and its monthly movements.

Every subscription block sent with a payment is an observation effective at the
payment's `paid_at`. The state of a subscription at an instant t is its latest
observation dated before t. "MRR at day D" is the state at the end of D, that is
at t = D+1 00:00 UTC: everything dated on D or earlier counts, a subscription
started on D counts, one whose `ended_at` falls on D does not.

Monthly values are Fractions (a yearly 100.00 is exactly 100/12 a month), summed
exactly and rounded to the currency's minor unit only in the figures returned.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from fractions import Fraction

from reports.money import apportion, round_money, to_minor
from reports.params import DateRange, day_start_ms, end_of_day_ms
from reports.revenue import UNATTRIBUTED

COUNTING_STATUSES = frozenset({"active", "past_due"})
MONTHLY_FACTORS = {
    "day": Fraction(365, 12),
    "week": Fraction(52, 12),
    "month": Fraction(1),
    "year": Fraction(1, 12),
}
MOVEMENT_TYPES = ("new", "expansion", "contraction", "churn", "reactivation")


@dataclass(frozen=True)
class Observation:
    """The subscription block of one payment, effective at that payment's paid_at."""

    subscription_id: str
    customer_id: str
    currency: str  # the carrying payment's currency
    observed_at: int  # unix ms
    status: str = "active"
    amount: Decimal | None = None
    interval: str | None = None
    plan: str | None = None
    started_at: int | None = None  # unix ms; missing means observed_at (the spec's default)
    ended_at: int | None = None
    seq: int = 0  # orders observations of the same instant: the higher one is later


@dataclass(frozen=True)
class SubscriptionPayment:
    """A payment that carried a subscription; succeeded charges are the fallback amount."""

    subscription_id: str
    currency: str
    amount: Decimal
    paid_at: int
    kind: str = "charge"
    status: str = "succeeded"
    seq: int = 0


@dataclass(frozen=True)
class SubscriptionValue:
    subscription_id: str
    customer_id: str
    currency: str
    plan: str | None
    monthly: Fraction


class SubscriptionHistory:
    """All observations and fallback charges of a site's subscriptions, queryable at any instant."""

    def __init__(self, observations: Iterable[Observation],
                 payments: Iterable[SubscriptionPayment] = ()):
        self._observations: dict[str, list[Observation]] = defaultdict(list)
        for obs in observations:
            self._observations[obs.subscription_id].append(obs)
        self._times: dict[str, list[int]] = {}
        for sub_id, history in self._observations.items():
            history.sort(key=lambda o: (o.observed_at, o.seq))
            self._times[sub_id] = [o.observed_at for o in history]
        # Fallback amounts: succeeded charges per (subscription, currency), oldest first.
        self._charges: dict[tuple[str, str], list[SubscriptionPayment]] = defaultdict(list)
        for payment in payments:
            if payment.kind == "charge" and payment.status == "succeeded":
                self._charges[(payment.subscription_id, payment.currency)].append(payment)
        self._charge_times: dict[tuple[str, str], list[int]] = {}
        for key, charges in self._charges.items():
            charges.sort(key=lambda p: (p.paid_at, p.seq))
            self._charge_times[key] = [p.paid_at for p in charges]

    def subscription_ids(self) -> list[str]:
        return sorted(self._observations)

    def latest(self, sub_id: str, t: int) -> Observation | None:
        """The latest observation dated before instant t."""
        i = bisect.bisect_left(self._times[sub_id], t)
        return self._observations[sub_id][i - 1] if i else None

    def _latest_charge(self, sub_id: str, currency: str, t: int) -> SubscriptionPayment | None:
        times = self._charge_times.get((sub_id, currency))
        if not times:
            return None
        i = bisect.bisect_left(times, t)
        return self._charges[(sub_id, currency)][i - 1] if i else None

    def value_at(self, sub_id: str, t: int) -> SubscriptionValue | None:
        """The subscription's monthly value at instant t, or None when it does not count."""
        obs = self.latest(sub_id, t)
        if obs is None or obs.status not in COUNTING_STATUSES:
            return None
        started = obs.observed_at if obs.started_at is None else obs.started_at
        if started >= t or (obs.ended_at is not None and obs.ended_at < t):
            return None
        amount = obs.amount
        if amount is None:
            charge = self._latest_charge(sub_id, obs.currency, t)
            amount = charge.amount if charge else Decimal(0)
        monthly = Fraction(amount) * MONTHLY_FACTORS[obs.interval or "month"]
        return SubscriptionValue(sub_id, obs.customer_id, obs.currency, obs.plan, monthly)

    def values_at(self, t: int) -> list[SubscriptionValue]:
        values = (self.value_at(sub_id, t) for sub_id in self.subscription_ids())
        return [v for v in values if v is not None]

    def first_positive(self, sub_id: str) -> dict[tuple[str, str], int]:
        """{(currency, customer): the first instant the subscription had a monthly value > 0}.

        Each observation rules the instants t in (observed_at, next observed_at]; within
        them the subscription is positive from max(observed_at, started_at, first fallback
        charge) + 1 ms up to ended_at inclusive. Linear in the observations.
        """
        history = self._observations[sub_id]
        first: dict[tuple[str, str], int] = {}
        for i, obs in enumerate(history):
            if obs.status not in COUNTING_STATUSES or obs.amount == 0:
                continue
            lower = max(obs.observed_at, obs.observed_at if obs.started_at is None
                        else obs.started_at)
            if obs.amount is None:
                charge_times = self._charge_times.get((sub_id, obs.currency))
                if not charge_times:
                    continue
                lower = max(lower, charge_times[0])
            lower += 1
            upper = None if i + 1 == len(history) else history[i + 1].observed_at + 1
            if obs.ended_at is not None:
                upper = obs.ended_at + 1 if upper is None else min(upper, obs.ended_at + 1)
            if upper is not None and lower >= upper:
                continue
            key = (obs.currency, obs.customer_id)
            first[key] = min(first.get(key, lower), lower)
        return first


@dataclass
class _Group:
    monthly: Fraction = Fraction(0)
    subscriptions: int = 0
    customers: set | None = None

    def add(self, value: SubscriptionValue) -> None:
        self.monthly += value.monthly
        self.subscriptions += 1
        if self.customers is None:
            self.customers = set()
        self.customers.add(value.customer_id)

    def figures(self, currency: str) -> dict:
        return {
            "mrr": round_money(self.monthly, currency),
            "subscriptions": self.subscriptions,
            "customers": len(self.customers or ()),
        }


def mrr_at(history: SubscriptionHistory, day: date, channels: Mapping[str, str]) -> dict:
    """{currency: {"mrr", "arr", "subscriptions", "customers", "by_channel", "by_plan"}} at the
    end of `day`. `arr` is 12 x the exact MRR, rounded (so it may differ by a few minor units
    from 12 x the rounded `mrr`). Channels are the customers' first-touch channels."""
    t = end_of_day_ms(day)
    totals: dict[str, _Group] = defaultdict(_Group)
    by_channel: dict[str, dict[str, _Group]] = defaultdict(lambda: defaultdict(_Group))
    by_plan: dict[str, dict[str | None, _Group]] = defaultdict(lambda: defaultdict(_Group))
    for value in history.values_at(t):
        totals[value.currency].add(value)
        channel = channels.get(value.customer_id) or UNATTRIBUTED
        by_channel[value.currency][channel].add(value)
        by_plan[value.currency][value.plan].add(value)
    report = {}
    for currency in sorted(totals):
        group = totals[currency]
        channel_rows = sorted(
            by_channel[currency].items(), key=lambda item: (-item[1].monthly, item[0]))
        plan_rows = sorted(
            by_plan[currency].items(),
            key=lambda item: (-item[1].monthly, item[0] is None, item[0] or ""))
        report[currency] = {
            **group.figures(currency),
            "arr": round_money(group.monthly * 12, currency),
            "by_channel": [{"channel": c, **g.figures(currency)} for c, g in channel_rows],
            "by_plan": [{"plan": p, **g.figures(currency)} for p, g in plan_rows],
        }
    return report


def month_windows(period: DateRange) -> list[tuple[date, date]]:
    """The calendar months the range touches, each clipped to the range: (first day, last day)."""
    windows = []
    first = period.start
    while True:
        if period.end.year == first.year and period.end.month == first.month:
            windows.append((first, period.end))
            return windows
        # Not the range's last month, so not December 9999: the next month exists.
        next_month = date(first.year + first.month // 12, first.month % 12 + 1, 1)
        windows.append((first, next_month - timedelta(days=1)))
        first = next_month


def _customer_values(history: SubscriptionHistory, t: int) -> dict[tuple[str, str], Fraction]:
    values: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
    for value in history.values_at(t):
        values[(value.currency, value.customer_id)] += value.monthly
    return values


def mrr_movements(history: SubscriptionHistory, period: DateRange) -> dict:
    """{currency: {"months": [row, ...]}} for each month the range touches.

    A month's window runs from the start of its first day in the range to the end of
    its last day in the range; `start_mrr` is the MRR at that start (the end of the
    previous day), `end_mrr` the MRR at its end. Each customer's monthly value in the
    currency moves from v0 to v1: 0 -> positive is `new` the first time the customer
    ever has a positive value in that currency and `reactivation` after that;
    positive -> 0 is `churn`; up is `expansion`, down is `contraction`. Churn and
    contraction are negative. The five add up exactly to end_mrr - start_mrr: each is
    rounded by largest remainder so the rounded figures keep that sum.
    """
    first_positive: dict[tuple[str, str], int] = {}
    for sub_id in history.subscription_ids():
        for key, instant in history.first_positive(sub_id).items():
            first_positive[key] = min(first_positive.get(key, instant), instant)

    months = []
    currencies: set[str] = set()
    for first, last in month_windows(period):
        t0, t1 = day_start_ms(first), end_of_day_ms(last)
        before, after = _customer_values(history, t0), _customer_values(history, t1)
        start: dict[str, Fraction] = defaultdict(Fraction)
        end: dict[str, Fraction] = defaultdict(Fraction)
        moves: dict[tuple[str, str], Fraction] = defaultdict(Fraction)  # (currency, type)
        for key in before.keys() | after.keys():
            currency = key[0]
            v0, v1 = before.get(key, Fraction(0)), after.get(key, Fraction(0))
            start[currency] += v0
            end[currency] += v1
            if v0 == v1:
                continue
            if v0 == 0:
                kind = "reactivation" if first_positive.get(key, t0) < t0 else "new"
            elif v1 == 0:
                kind = "churn"
            else:
                kind = "expansion" if v1 > v0 else "contraction"
            moves[(currency, kind)] += v1 - v0
        currencies |= {c for c, v in (*start.items(), *end.items()) if v}
        currencies |= {c for (c, _), v in moves.items() if v}
        months.append((first, last, start, end, moves))

    report = {}
    for currency in sorted(currencies):
        rows = []
        for first, last, start, end, moves in months:
            change = to_minor(end[currency], currency) - to_minor(start[currency], currency)
            parts = [moves[(currency, kind)] for kind in MOVEMENT_TYPES]
            rows.append({
                "month": first.strftime("%Y-%m"),
                "from": first.isoformat(),
                "to": last.isoformat(),
                "start_mrr": round_money(start[currency], currency),
                "end_mrr": round_money(end[currency], currency),
                **dict(zip(MOVEMENT_TYPES, apportion(parts, change, currency), strict=True)),
            })
        report[currency] = {"months": rows}
    return report
