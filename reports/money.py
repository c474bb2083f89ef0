"""Exact money: sums stay exact, rounding to the currency's minor unit happens once, at the end.

Values are Decimal (amounts as stored) or Fraction (monthly values such as a yearly
amount / 12, which no decimal represents exactly). Rounding is ROUND_HALF_UP
(halves away from zero), the commercial rounding people use when they check a
report by hand.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import orjson

# ISO 4217 currencies whose minor unit is not 2 decimal places (list one, 2025).
_NON_TWO_DECIMAL_EXPONENTS = {
    **dict.fromkeys(
        ("BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI",
         "VND", "VUV", "XAF", "XOF", "XPF"), 0),
    **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
    **dict.fromkeys(("CLF", "UYW"), 4),
}


def minor_unit_exponent(currency: str) -> int:
    """Decimal places of the currency's minor unit (EUR 2, JPY 0, KWD 3)."""
    return _NON_TWO_DECIMAL_EXPONENTS.get(currency.upper(), 2)


def round_half_up(value: Fraction | Decimal | int) -> int:
    """The nearest integer, halves away from zero."""
    value = Fraction(value)
    magnitude = math.floor(abs(value) + Fraction(1, 2))
    return magnitude if value >= 0 else -magnitude


def to_minor(value: Fraction | Decimal | int, currency: str) -> int:
    """The value in whole minor units of the currency, rounded half up."""
    return round_half_up(Fraction(value) * 10 ** minor_unit_exponent(currency))


def from_minor(units: int, currency: str) -> Decimal:
    """Minor units back to a Decimal with exactly the currency's decimal places."""
    return Decimal(units).scaleb(-minor_unit_exponent(currency))


def round_money(value: Fraction | Decimal | int, currency: str) -> Decimal:
    return from_minor(to_minor(value, currency), currency)


def apportion(parts: list[Fraction], total_minor: int, currency: str) -> list[Decimal]:
    """Round each part to minor units so the rounded parts add up to exactly `total_minor`.

    Largest remainder: every part becomes its floor or its ceiling, and the units
    missing from the sum of floors go to the parts with the largest remainders
    (ties to the earlier part). `total_minor` must lie within the sum of the parts'
    floors and ceilings, which holds when it is a rounding of (a difference of
    roundings of) their exact sum.
    """
    scale = 10 ** minor_unit_exponent(currency)
    scaled = [Fraction(p) * scale for p in parts]
    floors = [math.floor(s) for s in scaled]
    missing = total_minor - sum(floors)
    if not 0 <= missing <= sum(1 for s, f in zip(scaled, floors, strict=True) if s != f):
        raise ValueError(f"cannot apportion {total_minor} minor units over {parts}")
    by_remainder = sorted(range(len(parts)), key=lambda i: (-(scaled[i] - floors[i]), i))
    for i in by_remainder[:missing]:
        floors[i] += 1
    return [from_minor(units, currency) for units in floors]


def _encode(value):
    if isinstance(value, Decimal):
        # A JSON number with exactly the digits of the Decimal: 12.50 stays 12.50.
        return orjson.Fragment(format(value + 0, "f"))
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def dumps(payload) -> bytes:
    """orjson with Decimal written as an exact JSON number."""
    return orjson.dumps(payload, default=_encode)
