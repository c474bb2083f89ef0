"""Exact money: minor units per currency, half-up rounding, apportioning and JSON numbers."""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reports.money.amounts import (
    apportion,
    dumps,
    minor_unit_exponent,
    round_half_up,
    round_money,
    to_minor,
)


@pytest.mark.parametrize(("currency", "exponent"),
                         [("EUR", 2), ("USD", 2), ("JPY", 0), ("KRW", 0), ("KWD", 3),
                          ("BHD", 3), ("CLF", 4), ("usd", 2), ("XAU", 6)])
def test_minor_unit_exponent(currency, exponent):
    assert minor_unit_exponent(currency) == exponent


@pytest.mark.parametrize(
    ("value", "currency", "expected"),
    [
        (Decimal("0.125"), "EUR", "0.13"),  # half up, where half-even would give 0.12
        (Decimal("0.135"), "EUR", "0.14"),
        (Decimal("0.1249999"), "EUR", "0.12"),
        (Decimal("-0.125"), "EUR", "-0.13"),  # halves go away from zero
        (Fraction(100, 12), "USD", "8.33"),
        (Fraction(3, 120), "USD", "0.03"),  # 0.30 a year is 0.025 a month
        (Fraction(1000, 12), "JPY", "83"),
        (Decimal("1499.5"), "JPY", "1500"),
        (Fraction(52, 12), "KWD", "4.333"),
        (Decimal("19.99"), "EUR", "19.99"),
        (0, "EUR", "0.00"),
        # No ISO minor unit: as exact as given, up to six places, no trailing zeros.
        (Decimal("1.50"), "XAU", "1.5"),
        (Decimal("1.23456789"), "XAU", "1.234568"),
        (Decimal("1E+3"), "XAU", "1000"),
        (Fraction(1, 12), "XDR", "0.083333"),
        (0, "XTS", "0"),
    ],
)
def test_round_money(value, currency, expected):
    rounded = round_money(value, currency)
    assert str(rounded) == expected


def test_round_half_up_on_integers_and_halves():
    assert [round_half_up(Fraction(n, 2)) for n in range(-3, 4)] == [-2, -1, -1, 0, 1, 1, 2]


def test_apportion_keeps_the_rounded_total():
    # Two thirds of a cent each way: 8.333... + 8.333... must show as 16.67 in all.
    parts = [Fraction(100, 12), Fraction(100, 12), Fraction(0)]
    assert apportion(parts, 1667, "EUR") == [Decimal("8.34"), Decimal("8.33"), Decimal("0.00")]
    assert apportion(parts, 1666, "EUR") == [Decimal("8.33"), Decimal("8.33"), Decimal("0.00")]
    assert apportion([Fraction(-25), Fraction(13)], -1200, "USD") == [Decimal("-25.00"),
                                                                       Decimal("13.00")]
    with pytest.raises(ValueError):
        apportion(parts, 1669, "EUR")


money_values = st.fractions(min_value=0, max_value=1000, max_denominator=120)


@given(st.lists(st.tuples(money_values, money_values), max_size=6))
def test_apportion_matches_any_rounded_difference(customers):
    # Each customer's monthly value moves from v0 to v1 (never below zero, as MRR).
    parts = [v1 - v0 for v0, v1 in customers]
    start = sum((v0 for v0, _ in customers), Fraction(0))
    end = sum((v1 for _, v1 in customers), Fraction(0))
    target = to_minor(end, "USD") - to_minor(start, "USD")
    rounded = apportion(parts, target, "USD")
    assert sum(to_minor(r, "USD") for r in rounded) == target
    for exact, shown in zip(parts, rounded, strict=True):
        assert abs(Fraction(shown) - exact) < Fraction(1, 100)


def test_decimals_become_exact_json_numbers():
    body = dumps({"net": Decimal("80.00"), "mrr": Decimal("-0.00"), "jpy": Decimal("1200"),
                  "big": Decimal("123456789012345678.91"), "n": 3})
    assert body == b'{"net":80.00,"mrr":0.00,"jpy":1200,"big":123456789012345678.91,"n":3}'
    assert json.loads(body, parse_float=Decimal)["big"] == Decimal("123456789012345678.91")
    with pytest.raises(TypeError):
        dumps({"x": object()})
