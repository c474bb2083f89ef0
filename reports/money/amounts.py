"""Exact money: sums stay exact, rounding to the currency's minor unit happens once, at the end.

Values are Decimal (amounts as stored) or Fraction (monthly values such as a yearly
amount / 12, which no decimal represents exactly). Rounding is ROUND_HALF_UP
(halves away from zero), the commercial rounding people use when they check a
report by hand.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from decimal import Context, Decimal, Inexact, InvalidOperation, Overflow, localcontext
from fractions import Fraction

import orjson

from validation.common import minor_unit_exponent as iso_minor_unit_exponent

# Places kept for a code ISO 4217 gives no minor unit (gold XAU, SDR XDR, test XTS): their
# amounts are shown as exact as given, trailing zeros dropped, up to this many places.
UNITLESS_PLACES = 6


def minor_unit_exponent(currency: str) -> int:
    """Decimal places figures in the currency are rounded to (EUR 2, JPY 0, KWD 3)."""
    exponent = iso_minor_unit_exponent(currency)
    return UNITLESS_PLACES if exponent is None else exponent


# Sums of amounts stay exact with 60 significant digits; were one ever to need more, the
# Inexact trap raises instead of rounding silently.
_EXACT = Context(prec=60, traps=[Inexact, InvalidOperation, Overflow])


@contextmanager
def exact_decimals():
    """Decimal arithmetic inside the block is exact or raises."""
    with localcontext(_EXACT):
        yield


def round_half_up(value: Fraction | Decimal | int) -> int:
    """The nearest integer, halves away from zero."""
    value = Fraction(value)
    magnitude = math.floor(abs(value) + Fraction(1, 2))
    return magnitude if value >= 0 else -magnitude


def ratio(part: int, whole: int) -> float:
    """part / whole rounded half up to four decimals; 0 when whole is 0."""
    return round_half_up(Fraction(part, whole) * 10_000) / 10_000 if whole else 0.0


def to_minor(value: Fraction | Decimal | int, currency: str) -> int:
    """The value in whole minor units of the currency, rounded half up."""
    return round_half_up(Fraction(value) * 10 ** minor_unit_exponent(currency))


def from_minor(units: int, currency: str) -> Decimal:
    """Minor units back to a Decimal with exactly the currency's decimal places."""
    value = Decimal(units).scaleb(-minor_unit_exponent(currency), context=_EXACT)
    if iso_minor_unit_exponent(currency) is None:
        value = Decimal(0) if units == 0 else value.normalize(context=_EXACT)
        if value == value.to_integral_value(context=_EXACT):
            return value.quantize(Decimal(1), context=_EXACT)
        return value
    return value


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
        # Adding 0 turns -0 into 0; in the exact context, never rounding.
        return orjson.Fragment(format(_EXACT.add(value, 0), "f"))
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def dumps(payload) -> bytes:
    """orjson with Decimal written as an exact JSON number."""
    return orjson.dumps(payload, default=_encode)


def json_ready(value):
    """The value with each Decimal replaced by its exact JSON number, for a plain
    orjson.dumps elsewhere (the CLI)."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_ready(v) for v in value]
    if isinstance(value, Decimal):
        return _encode(value)
    return value
