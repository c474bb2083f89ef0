"""Monthly recurring revenue from dated subscription observations, and its monthly movements.

Every subscription block sent with a payment is an observation effective at the
payment's `paid_at`. The state of a subscription at an instant t is its latest
observation dated before t. "MRR at day D" is the state at the end of D, that is
at t = D+1 00:00 UTC: everything dated on D or earlier counts, a subscription
started on D counts, one whose `ended_at` falls on D does not.

Values are kept per year, as exact Decimals (12 x a monthly amount, 52 x a weekly one,
365 x a daily one), so sums stay exact; MRR is that sum / 12, rounded to the currency's
minor unit only in the figures returned (a yearly 100.00 is exactly 100/12 a month).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import NamedTuple, Protocol

from reports.money.amounts import apportion, exact_decimals, round_money, to_minor
from reports.shared.params import DateRange, day_start_ms, end_of_day_ms
from vocabulary import UNATTRIBUTED

COUNTING_STATUSES = frozenset({"active", "past_due"})
YEARLY_FACTORS = {"day": 365, "week": 52, "month": 12, "year": 1}
MOVEMENT_TYPES = ("new", "expansion", "contraction", "churn", "reactivation")


class Observation(NamedTuple):
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


class SubscriptionPayment(NamedTuple):
    """A payment that carried a subscription; succeeded charges are the fallback amount."""

    subscription_id: str
    currency: str
    amount: Decimal
    paid_at: int
    kind: str = "charge"
    status: str = "succeeded"
    seq: int = 0


class SubscriptionValue(NamedTuple):
    subscription_id: str
    customer_id: str
    currency: str
    plan: str | None
    yearly: Decimal  # 12 x the monthly value, exact

    @property
    def monthly(self) -> Fraction:
        return Fraction(self.yearly) / 12


class SubscriptionState(NamedTuple):
    """A subscription's latest observation before an instant, and the amount of its latest
    succeeded charge in that currency before the instant (used when the state has none)."""

    subscription_id: str
    customer_id: str
    currency: str
    status: str
    amount: Decimal | None
    interval: str | None
    plan: str | None
    started_at: int
    ended_at: int | None
    fallback_amount: Decimal | None = None


def monthly_value(state: SubscriptionState, t: int) -> SubscriptionValue | None:
    """The subscription's value at instant t, or None when it does not count."""
    if state.status not in COUNTING_STATUSES or state.started_at >= t:
        return None
    if state.ended_at is not None and state.ended_at < t:
        return None
    amount = state.amount if state.amount is not None else state.fallback_amount or Decimal(0)
    yearly = amount * YEARLY_FACTORS[state.interval or "month"]
    return SubscriptionValue(state.subscription_id, state.customer_id, state.currency,
                             state.plan, yearly)


class SubscriptionSource(Protocol):
    """Where the reports read subscriptions from: memory (SubscriptionHistory) or SQL."""

    def states_at(self, t: int,
                  subscription_ids: Collection[str] | None = None) -> list[SubscriptionState]:
        """The state at instant t of every subscription observed before t (or of those)."""

    def changed_between(self, t0: int, t1: int) -> set[str]:
        """Subscriptions with an observation or a succeeded charge dated in [t0, t1): the only
        ones whose state at t1 can differ from their state at t0."""

    def first_positive(self, until: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
        """For each (currency, customer) key, the first instant its value in that currency was
        above zero when that instant is before until[key]; otherwise any instant from
        until[key] on, or nothing (never positive)."""


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

    def state_at(self, sub_id: str, t: int) -> SubscriptionState | None:
        obs = self.latest(sub_id, t)
        if obs is None:
            return None
        charge = self._latest_charge(sub_id, obs.currency, t)
        started = obs.observed_at if obs.started_at is None else obs.started_at
        return SubscriptionState(sub_id, obs.customer_id, obs.currency, obs.status, obs.amount,
                                 obs.interval, obs.plan, started, obs.ended_at,
                                 charge.amount if charge else None)

    def states_at(self, t: int,
                  subscription_ids: Collection[str] | None = None) -> list[SubscriptionState]:
        wanted = self.subscription_ids() if subscription_ids is None else sorted(
            set(subscription_ids) & self._observations.keys())
        states = (self.state_at(sub_id, t) for sub_id in wanted)
        return [state for state in states if state is not None]

    def changed_between(self, t0: int, t1: int) -> set[str]:
        changed = {sub_id for sub_id, times in self._times.items()
                   if bisect.bisect_left(times, t0) < bisect.bisect_left(times, t1)}
        changed |= {sub_id for (sub_id, _), times in self._charge_times.items()
                    if bisect.bisect_left(times, t0) < bisect.bisect_left(times, t1)}
        return changed

    def value_at(self, sub_id: str, t: int) -> SubscriptionValue | None:
        """The subscription's monthly value at instant t, or None when it does not count."""
        state = self.state_at(sub_id, t)
        return None if state is None else monthly_value(state, t)

    def first_positive(self, until: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
        wanted = set(until)
        first: dict[tuple[str, str], int] = {}
        for sub_id in self.subscription_ids():
            for key, instant in self.first_positive_of(sub_id).items():
                if key in wanted:
                    first[key] = min(first.get(key, instant), instant)
        return first

    def first_positive_of(self, sub_id: str) -> dict[tuple[str, str], int]:
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
    yearly: Decimal = Decimal(0)
    subscriptions: int = 0
    customers: set = field(default_factory=set)

    def add(self, value: SubscriptionValue) -> None:
        self.yearly += value.yearly
        self.subscriptions += 1
        self.customers.add(value.customer_id)

    def figures(self, currency: str) -> dict:
        return {
            "mrr": round_money(Fraction(self.yearly) / 12, currency),
            "subscriptions": self.subscriptions,
            "customers": len(self.customers),
        }


def values_at(source: SubscriptionSource, t: int) -> list[SubscriptionValue]:
    values = (monthly_value(state, t) for state in source.states_at(t))
    return [v for v in values if v is not None]


def mrr_at(source: SubscriptionSource, day: date, channels: Mapping[str, str]) -> dict:
    """{currency: {"mrr", "arr", "subscriptions", "customers", "by_channel", "by_plan"}} at the
    end of `day`. `arr` is 12 x the exact MRR, rounded (so it may differ by a few minor units
    from 12 x the rounded `mrr`). Channels are the customers' first-touch channels."""
    t = end_of_day_ms(day)
    totals: dict[str, _Group] = defaultdict(_Group)
    by_channel: dict[str, dict[str, _Group]] = defaultdict(lambda: defaultdict(_Group))
    by_plan: dict[str, dict[str | None, _Group]] = defaultdict(lambda: defaultdict(_Group))
    with exact_decimals():
        for value in values_at(source, t):
            totals[value.currency].add(value)
            channel = channels.get(value.customer_id) or UNATTRIBUTED
            by_channel[value.currency][channel].add(value)
            by_plan[value.currency][value.plan].add(value)
    report = {}
    for currency in sorted(totals):
        group = totals[currency]
        channel_rows = sorted(
            by_channel[currency].items(), key=lambda item: (-item[1].yearly, item[0]))
        plan_rows = sorted(
            by_plan[currency].items(),
            key=lambda item: (-item[1].yearly, item[0] is None, item[0] or ""))
        report[currency] = {
            **group.figures(currency),
            "arr": round_money(group.yearly, currency),
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


def _customer_values(states: Iterable[SubscriptionState],
                     t: int) -> dict[tuple[str, str], Decimal]:
    """Yearly value per (currency, customer) at instant t."""
    values: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    with exact_decimals():
        for state in states:
            value = monthly_value(state, t)
            if value is not None:
                values[(value.currency, value.customer_id)] += value.yearly
    return values


def _values_at_instants(source: SubscriptionSource,
                        instants: list[int]) -> dict[int, dict[tuple[str, str], Decimal]]:
    """Customer values at each instant (ascending): the states of all subscriptions are read
    once, then only those of subscriptions that changed in between."""
    states = {s.subscription_id: s for s in source.states_at(instants[0])}
    values = {instants[0]: _customer_values(states.values(), instants[0])}
    for previous, t in zip(instants, instants[1:], strict=False):
        changed = source.changed_between(previous, t)
        if changed:
            states.update((s.subscription_id, s) for s in source.states_at(t, changed))
        values[t] = _customer_values(states.values(), t)
    return values


def mrr_movements(source: SubscriptionSource, period: DateRange) -> dict:
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
    windows = [(first, last, day_start_ms(first), end_of_day_ms(last))
               for first, last in month_windows(period)]
    # A month's end is the next month's start: each instant is read once.
    values = _values_at_instants(source, sorted({t for w in windows for t in w[2:]}))
    # Customers going from 0 to a positive value, with the latest start of such a month.
    arrivals: dict[tuple[str, str], int] = {}
    for _, _, t0, t1 in windows:
        for key, v1 in values[t1].items():
            if v1 and not values[t0].get(key):
                arrivals[key] = t0
    first_positive = source.first_positive(arrivals)

    months = []
    currencies: set[str] = set()
    zero = Decimal(0)
    for first, last, t0, t1 in windows:
        before, after = values[t0], values[t1]
        start: dict[str, Decimal] = defaultdict(Decimal)  # yearly values, exact
        end: dict[str, Decimal] = defaultdict(Decimal)
        moves: dict[tuple[str, str], Decimal] = defaultdict(Decimal)  # (currency, type)
        with exact_decimals():
            for key in before.keys() | after.keys():
                currency = key[0]
                v0, v1 = before.get(key, zero), after.get(key, zero)
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
            start_mrr, end_mrr = Fraction(start[currency]) / 12, Fraction(end[currency]) / 12
            change = to_minor(end_mrr, currency) - to_minor(start_mrr, currency)
            parts = [Fraction(moves[(currency, kind)]) / 12 for kind in MOVEMENT_TYPES]
            rows.append({
                "month": first.strftime("%Y-%m"),
                "from": first.isoformat(),
                "to": last.isoformat(),
                "start_mrr": round_money(start_mrr, currency),
                "end_mrr": round_money(end_mrr, currency),
                **dict(zip(MOVEMENT_TYPES, apportion(parts, change, currency), strict=True)),
            })
        report[currency] = {"months": rows}
    return report
