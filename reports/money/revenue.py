"""Revenue per currency and per first-touch channel, from payment rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import NamedTuple

from reports.money.amounts import exact_decimals, round_money
from vocabulary import UNATTRIBUTED


class PaymentRow(NamedTuple):
    """`count` stored payments alike in all these fields (one, unless SQL grouped them)."""

    customer_id: str
    kind: str
    status: str
    currency: str
    amount: Decimal
    fee: Decimal | None = None
    count: int = 1


class RevenuePayment(NamedTuple):
    """`count` succeeded payments alike, dated at `at_ms`'s bucket."""

    customer_id: str
    kind: str
    currency: str
    amount: Decimal
    at_ms: int
    count: int = 1


@dataclass
class _Totals:
    gross: Decimal = Decimal(0)
    refunds: Decimal = Decimal(0)
    chargebacks: Decimal = Decimal(0)
    fees: Decimal = Decimal(0)
    payments: int = 0
    customers: set = field(default_factory=set)

    def add(self, row: PaymentRow) -> None:
        amount = row.amount * row.count
        if row.kind == "charge":
            self.gross += amount
        elif row.kind == "refund":
            self.refunds += amount
        elif row.kind == "chargeback":
            self.chargebacks += amount
        else:
            raise ValueError(f"unknown payment kind {row.kind!r}")
        self.fees += (row.fee or 0) * row.count
        self.payments += row.count
        self.customers.add(row.customer_id)

    def figures(self, currency: str) -> dict:
        with exact_decimals():
            net = self.gross - self.refunds - self.chargebacks
            net_after_fees = net - self.fees
        return {
            "gross": round_money(self.gross, currency),
            "refunds": round_money(self.refunds, currency),
            "chargebacks": round_money(self.chargebacks, currency),
            "fees": round_money(self.fees, currency),
            "net": round_money(net, currency),
            "net_after_fees": round_money(net_after_fees, currency),
            "payments": self.payments,
            "customers": len(self.customers),
        }


def revenue_by_currency(rows: Iterable[PaymentRow], channels: Mapping[str, str]) -> dict:
    """{currency: {figures..., "by_channel": [{"channel", figures...}]}}.

    Only succeeded payments count; the caller has already kept the rows whose
    paid_at lies in the range. A payment takes its customer's first-touch channel
    (`channels`, customer id -> channel; a customer missing there is Unattributed),
    so a refund lands on the channel of the customer who paid. `net` and
    `net_after_fees` are computed exactly, then rounded, so they can differ by one
    minor unit from the difference of the rounded figures when amounts carry more
    decimals than the currency.
    """
    totals: dict[str, _Totals] = {}
    by_channel: dict[str, dict[str, _Totals]] = {}
    with exact_decimals():
        for row in rows:
            if row.status != "succeeded":
                continue
            channel = channels.get(row.customer_id) or UNATTRIBUTED
            totals.setdefault(row.currency, _Totals()).add(row)
            by_channel.setdefault(row.currency, {}).setdefault(channel, _Totals()).add(row)
    report = {}
    for currency in sorted(totals):
        channel_rows = [
            {"channel": channel, **t.figures(currency)}
            for channel, t in by_channel[currency].items()
        ]
        channel_rows.sort(key=lambda r: (-r["net"], r["channel"]))
        report[currency] = {**totals[currency].figures(currency), "by_channel": channel_rows}
    return report
