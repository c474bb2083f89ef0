"""Goals (custom events) with their conversions and the revenue of the customers who
converted. Pure shaping of counted rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from reports.money.amounts import exact_decimals, ratio, round_money
from reports.money.revenue import PaymentRow
from reports.segments.queries import SegmentCount


def goal_rows(counts: Iterable[SegmentCount], visitors: int,
              converted: Mapping[str, set[str]], payments: Iterable[PaymentRow],
              limit: int) -> list[dict]:
    """One row per custom event: `conversions` (its visitors, per day summed), `events`,
    `conversion_rate` (conversions / the range's visitors) and per currency the `net`
    revenue in the range of the customers who converted (a linked visitor id did the event
    in the range) and how many of them paid. Sorted by conversions, then name."""
    net: dict[str, dict[str, Decimal]] = {}
    with exact_decimals():
        for p in payments:
            sign = 1 if p.kind == "charge" else -1
            per_currency = net.setdefault(p.customer_id, {})
            per_currency[p.currency] = per_currency.get(p.currency, Decimal(0)) \
                + sign * p.amount * p.count
    rows = []
    for c in sorted(counts, key=lambda c: (-c.visitors, c.value or "")):
        if c.value is None:
            continue
        revenue: dict[str, dict] = {}
        with exact_decimals():
            for customer in sorted(converted.get(c.value, ())):
                for currency, amount in net.get(customer, {}).items():
                    entry = revenue.setdefault(currency, {"net": Decimal(0), "customers": 0})
                    entry["net"] += amount
                    entry["customers"] += 1
        rows.append({
            "name": c.value, "conversions": c.visitors, "events": c.events,
            "conversion_rate": ratio(c.visitors, visitors),
            "revenue": {currency: {"net": round_money(e["net"], currency),
                                   "customers": e["customers"]}
                        for currency, e in sorted(revenue.items())},
        })
    return rows[:limit]
