"""Revenue per currency and per value of one first-touch dimension, with traffic per row.

Pure: payment rows, each customer's value, and the traffic of each value come in; the
rows of the report come out. A customer without a first touch is in the `Unattributed`
row; a customer whose first touch has no value for the dimension (a direct visit has no
source) is in the row whose value is null.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from fractions import Fraction
from typing import NamedTuple

from reports.money.amounts import exact_decimals, ratio, round_money
from reports.money.revenue import UNATTRIBUTED, PaymentRow, _Totals

# Dimensions of the first-touch session, of its first event, and the plan.
SESSION_DIMENSIONS = ("channel", "source", "medium", "campaign", "term", "content", "referrer",
                      "landing_page")
EVENT_DIMENSIONS = ("country", "device", "browser", "os")
REVENUE_DIMENSIONS = (*SESSION_DIMENSIONS, *EVENT_DIMENSIONS, "plan")
_NO_VALUE = object()


class ValueTraffic(NamedTuple):
    """For one value: visitors of the sessions started in the range with it, and for each
    currency the customers first-touched in the range with it who paid in that currency."""

    visitors: int
    paying: Mapping[str, int]


def revenue_by_value(rows: Iterable[PaymentRow], values: Mapping[str, str | None],
                     traffic: Mapping[str | None, ValueTraffic] | None) -> dict:
    """{currency: [row, ...]}, each row {"value", revenue figures..., and with `traffic`:
    "visitors", "paying_customers", "conversion_rate", "net_per_visitor"}.

    `values` maps each customer with a first touch to its value (None when the first touch
    has none); a customer missing there is Unattributed. Rows with traffic (`traffic` has
    the value and visitors > 0) get: visitors; paying_customers, the customers first
    touched in the range with that value who have a succeeded charge in the currency;
    conversion_rate = paying_customers / visitors (four decimals); net_per_visitor = net /
    visitors, rounded once to the currency. Other rows have those four as null (the
    Unattributed row always). Sorted by net (highest first), then value (null last)."""
    groups: dict[str, dict[object, _Totals]] = {}
    with exact_decimals():
        for row in rows:
            if row.status != "succeeded":
                continue
            value = values[row.customer_id] if row.customer_id in values else _NO_VALUE
            groups.setdefault(row.currency, {}).setdefault(value, _Totals()).add(row)
    report = {}
    for currency in sorted(groups):
        result = []
        for value, totals in groups[currency].items():
            figures = totals.figures(currency)
            shown = UNATTRIBUTED if value is _NO_VALUE else value
            row = {"value": shown, **figures}
            if traffic is not None:
                row.update(_per_visitor(
                    None if value is _NO_VALUE else traffic.get(value), currency,
                    totals.gross - totals.refunds - totals.chargebacks))
            result.append(row)
        result.sort(key=lambda r: (-r["net"], r["value"] is None, r["value"] or ""))
        report[currency] = result
    return report


def _per_visitor(traffic: ValueTraffic | None, currency: str, net: Decimal) -> dict:
    if traffic is None or traffic.visitors <= 0:
        return {"visitors": None, "paying_customers": None, "conversion_rate": None,
                "net_per_visitor": None}
    paying = traffic.paying.get(currency, 0)
    return {"visitors": traffic.visitors, "paying_customers": paying,
            "conversion_rate": ratio(paying, traffic.visitors),
            "net_per_visitor": round_money(Fraction(net) / traffic.visitors, currency)}


def paying_by_value(first_touched: Mapping[str, str | None],
                    charged: Iterable[tuple[str, str]]) -> dict[str | None, dict[str, int]]:
    """value -> currency -> customers first-touched in the range (`first_touched`, customer
    -> value) with a succeeded charge in the currency (`charged`: (customer, currency))."""
    result: dict[str | None, dict[str, int]] = {}
    for customer, currency in charged:
        if customer in first_touched:
            per_currency = result.setdefault(first_touched[customer], {})
            per_currency[currency] = per_currency.get(currency, 0) + 1
    return result
