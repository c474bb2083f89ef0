"""Revenue per currency and first-touch channel, against hand-computed figures."""

from __future__ import annotations

from decimal import Decimal

import pytest

from reports.money.amounts import dumps
from reports.money.revenue import PaymentRow, revenue_by_currency

D = Decimal
CHANNELS = {"c1": "Organic Search", "c2": "Paid Search", "c4": "Direct", "c5": "Direct"}
ROWS = [
    # EUR
    PaymentRow("c1", "charge", "succeeded", "EUR", D("100.00"), D("3.20")),
    PaymentRow("c1", "refund", "succeeded", "EUR", D("20.00"), D("0")),
    PaymentRow("c1", "charge", "failed", "EUR", D("50.00"), D("1.00")),
    PaymentRow("c1", "charge", "pending", "EUR", D("30.00")),
    PaymentRow("c1", "refund", "failed", "EUR", D("100.00")),
    PaymentRow("c2", "charge", "succeeded", "EUR", D("49.99"), D("1.75")),
    PaymentRow("c2", "chargeback", "succeeded", "EUR", D("49.99"), D("15.00")),
    PaymentRow("c3", "charge", "succeeded", "EUR", D("25.00"), D("1.00")),  # no channel known
    # USD
    PaymentRow("c4", "charge", "succeeded", "USD", D("19.99"), D("0.88")),
    PaymentRow("c1", "charge", "succeeded", "USD", D("5.00")),
    # JPY: no minor unit
    PaymentRow("c5", "charge", "succeeded", "JPY", D("1200"), D("36")),
]


def figures(gross, refunds, chargebacks, fees, net, net_after_fees, payments, customers):
    return {"gross": D(gross), "refunds": D(refunds), "chargebacks": D(chargebacks),
            "fees": D(fees), "net": D(net), "net_after_fees": D(net_after_fees),
            "payments": payments, "customers": customers}


def test_revenue_by_currency_and_channel():
    report = revenue_by_currency(ROWS, CHANNELS)
    assert list(report) == ["EUR", "JPY", "USD"]
    eur = report["EUR"]
    # gross 100 + 49.99 + 25; net 174.99 - 20 - 49.99; fees 3.20 + 0 + 1.75 + 15 + 1.
    assert {k: v for k, v in eur.items() if k != "by_channel"} == figures(
        "174.99", "20.00", "49.99", "20.95", "105.00", "84.05", 5, 3)
    assert eur["by_channel"] == [
        {"channel": "Organic Search", **figures("100", "20", "0", "3.20", "80", "76.80", 2, 1)},
        {"channel": "Unattributed", **figures("25", "0", "0", "1", "25", "24", 1, 1)},
        {"channel": "Paid Search", **figures("49.99", "0", "49.99", "16.75", "0", "-16.75", 2, 1)},
    ]
    usd = report["USD"]
    assert {k: v for k, v in usd.items() if k != "by_channel"} == figures(
        "24.99", "0", "0", "0.88", "24.99", "24.11", 2, 2)
    assert [(r["channel"], r["net"]) for r in usd["by_channel"]] == [
        ("Direct", D("19.99")), ("Organic Search", D("5.00"))]
    assert report["JPY"]["net_after_fees"] == D("1164")


def test_figures_carry_exactly_the_currency_decimals_in_json():
    body = dumps(revenue_by_currency(ROWS, CHANNELS))
    assert b'"EUR":{"gross":174.99,"refunds":20.00,"chargebacks":49.99,"fees":20.95,' in body
    assert b'"net":105.00,"net_after_fees":84.05,"payments":5,"customers":3' in body
    assert b'"JPY":{"gross":1200,"refunds":0,"chargebacks":0,"fees":36,"net":1200,' in body


def test_refund_takes_the_channel_of_its_customer():
    rows = [PaymentRow("c9", "charge", "succeeded", "EUR", D("10")),
            PaymentRow("c9", "refund", "succeeded", "EUR", D("4"))]
    report = revenue_by_currency(rows, {"c9": "Email"})
    assert report["EUR"]["by_channel"] == [
        {"channel": "Email", **figures("10", "4", "0", "0", "6", "6", 2, 1)}]


def test_sums_are_exact_and_rounded_once():
    # Three payments of 0.005 sum to 0.015 -> 0.02; rounding each first would give 0.03.
    rows = [PaymentRow(f"c{i}", "charge", "succeeded", "EUR", D("0.005")) for i in range(3)]
    assert revenue_by_currency(rows, {})["EUR"]["gross"] == D("0.02")


def test_channels_with_equal_net_sort_by_name_and_nothing_counted_is_empty():
    rows = [PaymentRow("a", "charge", "succeeded", "USD", D("5")),
            PaymentRow("b", "charge", "succeeded", "USD", D("5"))]
    report = revenue_by_currency(rows, {"a": "Referral", "b": "Email"})
    assert [r["channel"] for r in report["USD"]["by_channel"]] == ["Email", "Referral"]
    assert revenue_by_currency([PaymentRow("a", "charge", "failed", "USD", D("5"))], {}) == {}


def test_unknown_kind_is_a_bug_not_a_silent_zero():
    with pytest.raises(ValueError):
        revenue_by_currency([PaymentRow("a", "gift", "succeeded", "USD", D("5"))], {})
