"""Checks shared by the validators: RFC 3339 times, ISO codes and exact JSON numbers.

Pure functions without I/O; each returns a cleaned value or raises a small named
exception that the caller turns into the spec's message for its field.
"""

from __future__ import annotations

import datetime
import math
import re
from decimal import Decimal

from validation.iso_codes import COUNTRY_CODES, CURRENCY_MINOR_UNITS

# A real timestamp for messages that must show one.
RFC3339_EXAMPLE = "2026-01-31T09:30:00Z"

# RFC 3339 section 5.6: full-date "T" partial-time time-offset ("T" and "Z" in either case).
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
# The days whose last UTC minute had a 61st second (IERS Bulletin C); none since 2016.
LEAP_SECOND_DAYS = frozenset(
    datetime.date.fromisoformat(day)
    for day in (
        "1972-06-30 1972-12-31 1973-12-31 1974-12-31 1975-12-31 1976-12-31 1977-12-31 "
        "1978-12-31 1979-12-31 1981-06-30 1982-06-30 1983-06-30 1985-06-30 1987-12-31 "
        "1989-12-31 1990-12-31 1992-06-30 1993-06-30 1994-06-30 1995-12-31 1997-06-30 "
        "1998-12-31 2005-12-31 2008-12-31 2012-06-30 2015-06-30 2016-12-31"
    ).split()
)
_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()
# Instants whose UTC date lies in years 0001..9999, like the local dates the grammar allows.
_MIN_UNIX_SECONDS = (datetime.date(1, 1, 1).toordinal() - _EPOCH_ORDINAL) * 86_400
_MAX_UNIX_SECONDS = (datetime.date(9999, 12, 31).toordinal() - _EPOCH_ORDINAL + 1) * 86_400 - 1

# ISO 4217 list one (the iso4217 package's table), minor units as published: None where
# ISO says "N.A." (gold, SDR, the test code XTS, XXX); ISO 3166-1 from pycountry. Both are
# read from validation/iso_codes.py, which scripts/iso_codes.py writes from those packages.
CURRENCY_CODES = frozenset(CURRENCY_MINOR_UNITS)


class InvalidTimestamp(ValueError):
    """Not an RFC 3339 date-time, or one naming a moment that cannot exist."""


class UnknownCode(ValueError):
    """Not a code of the ISO list asked for."""


class InvalidNumber(ValueError):
    """Not a finite JSON number (booleans and numeric strings included)."""


def parse_rfc3339(value: object) -> int:
    """Unix milliseconds (fraction truncated toward the past) of an RFC 3339 date-time.

    Impossible dates and times fail; a leap second (:60) is accepted only at 23:59:60 UTC
    on a day that had one, and counts as the next day's midnight, as Unix time does.
    """
    if not isinstance(value, str):
        raise InvalidTimestamp("not a string")
    match = _RFC3339.fullmatch(value)
    if match is None:
        raise InvalidTimestamp("not RFC 3339")
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    fraction, zulu, sign, offset_hour, offset_minute = match.group(7, 8, 9, 10, 11)
    try:
        date = datetime.date(year, month, day)
    except ValueError:
        raise InvalidTimestamp("no such date") from None
    if hour > 23 or minute > 59 or second > 60:
        raise InvalidTimestamp("no such time")
    offset = 0
    if not zulu:
        if int(offset_hour) > 23 or int(offset_minute) > 59:
            raise InvalidTimestamp("no such offset")
        offset = (int(offset_hour) * 60 + int(offset_minute)) * 60 * (-1 if sign == "-" else 1)
    local_seconds = (date.toordinal() - _EPOCH_ORDINAL) * 86_400 + hour * 3600 + minute * 60
    utc_seconds = local_seconds + second - offset
    if second == 60:
        utc_minute_start = local_seconds - offset
        utc_day, minute_of_day = divmod(utc_minute_start, 86_400)
        last_minute = minute_of_day == 86_400 - 60
        if not last_minute or datetime.date.fromordinal(utc_day + _EPOCH_ORDINAL) not in LEAP_SECOND_DAYS:
            raise InvalidTimestamp("no leap second at that time")
    millis = int((fraction[1:] + "00")[:3]) if fraction else 0
    if not _MIN_UNIX_SECONDS <= utc_seconds <= _MAX_UNIX_SECONDS:
        raise InvalidTimestamp("outside years 0001 to 9999 in UTC")
    return utc_seconds * 1000 + millis



def currency_code(value: object) -> str:
    """An ISO 4217 alphabetic code, upper-cased (Stripe-style "usd" is accepted)."""
    if isinstance(value, str) and len(value) == 3 and value.upper() in CURRENCY_CODES:
        return value.upper()
    raise UnknownCode("not an ISO 4217 code")


def country_code(value: object) -> str:
    """An officially assigned ISO 3166-1 alpha-2 code, upper-cased."""
    if isinstance(value, str) and len(value) == 2 and value.upper() in COUNTRY_CODES:
        return value.upper()
    raise UnknownCode("not an ISO 3166-1 alpha-2 code")


def minor_unit_exponent(currency: str) -> int | None:
    """Digits after the decimal point of the currency's minor unit (USD 2, JPY 0, KWD 3).

    None for codes without a minor unit in ISO 4217 (XAU, XDR, XTS, XXX, ...): amounts in
    them are kept as given and not rounded. KeyError for a code that is not ISO 4217.
    """
    return CURRENCY_MINOR_UNITS[currency.upper()]


def json_decimal(value: object) -> Decimal:
    """The exact decimal a JSON number spelled, from orjson's int or float.

    orjson reads non-integers as binary floats. repr() of a float is the shortest text
    that reads back to the same float, so every JSON number of at most 15 significant
    digits (any realistic amount: 9,999,999,999,999.99 has 15) comes back digit for
    digit; longer ones come back as the nearest double's shortest spelling.
    """
    if isinstance(value, Decimal) and value.is_finite():
        return value  # built in code (the Stripe mapping), never parsed from a request
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidNumber("not a number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidNumber("not finite")
        return Decimal(repr(value))
    return Decimal(value)


def decimal_text(value: Decimal) -> str:
    """Canonical plain text of a decimal: no exponent, no trailing zeros, "0" for zero."""
    if value.is_zero():
        return "0"
    text = format(value, "f")  # exact: "f" without a precision never rounds
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text
