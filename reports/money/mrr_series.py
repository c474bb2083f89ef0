"""Each customer's subscription value at many instants (the MRR of every bucket's end).

reports.money.mrr reads the states once and then only the subscriptions that changed; here the
values are also kept up to date one subscription at a time: between two instants a
subscription's value changes only when it was observed or charged in between, or when
its start or end falls in between. So a series of hours costs about what its changes
cost, not instants x subscriptions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from decimal import Decimal

from reports.money.amounts import exact_decimals
from reports.money.mrr import (
    SubscriptionSource,
    SubscriptionState,
    SubscriptionValue,
    monthly_value,
)


def values_at_instants(source: SubscriptionSource,
                       instants: list[int]) -> dict[int, dict[tuple[str, str], Decimal]]:
    """{t: {(currency, customer): yearly value}} for each instant (ascending, distinct)."""
    if not instants:
        return {}
    states = {s.subscription_id: s for s in source.states_at(instants[0])}
    values: dict[str, SubscriptionValue | None] = {}
    totals: dict[tuple[str, str], Decimal] = defaultdict(Decimal)

    def update(sub_id: str, t: int) -> None:
        old, new = values.get(sub_id), monthly_value(states[sub_id], t)
        if old is not None:
            totals[(old.currency, old.customer_id)] -= old.yearly
        if new is not None:
            totals[(new.currency, new.customer_id)] += new.yearly
        values[sub_id] = new

    result = {}
    with exact_decimals():
        for sub_id in states:
            update(sub_id, instants[0])
        result[instants[0]] = dict(totals)
        for previous, t in zip(instants, instants[1:], strict=False):
            changed = source.changed_between(previous, t)
            if changed:
                states.update((s.subscription_id, s) for s in source.states_at(t, changed))
            crossing = {sub_id for sub_id, s in states.items()
                        if previous <= s.started_at < t
                        or (s.ended_at is not None and previous <= s.ended_at < t)}
            for sub_id in (set(changed) | crossing) & states.keys():
                update(sub_id, t)
            result[t] = dict(totals)
    return result


class CustomersOnly:
    """A SubscriptionSource that shows only the subscriptions of the customers `keep`
    accepts (filters on MRR select customers by first touch)."""

    def __init__(self, source: SubscriptionSource, keep: Callable[[str], bool]):
        self.source = source
        self.keep = keep

    def states_at(self, t: int,
                  subscription_ids: Collection[str] | None = None) -> list[SubscriptionState]:
        return [s for s in self.source.states_at(t, subscription_ids) if self.keep(s.customer_id)]

    def changed_between(self, t0: int, t1: int) -> set[str]:
        return self.source.changed_between(t0, t1)

    def first_positive(self, until: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
        return self.source.first_positive(until)

    @property
    def channels(self) -> dict[str, str]:
        return self.source.channels
