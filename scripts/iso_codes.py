"""Writes validation/iso_codes.py: the ISO 4217 currencies with their minor units (from the
`iso4217` package, which ships the maintenance agency's table) and the ISO 3166-1 alpha-2
country codes (from `pycountry`, Debian's iso-codes data). Importing those packages costs a
process about 70 ms (an XML parse, an enum, a scan of every installed distribution), a
third of importing the app, so the service reads this table instead and
tests/test_iso_codes.py checks that it still says what the pinned packages say.

Run after upgrading either package: `.venv/bin/python scripts/iso_codes.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import iso4217
import pycountry

TARGET = Path(__file__).resolve().parent.parent / "validation" / "iso_codes.py"


def minor_units() -> dict[str, int | None]:
    """ISO 4217 list one's minor units as published: None where ISO says "N.A."."""
    return {
        code: (int(entry["CcyMnrUnts"]) if entry["CcyMnrUnts"].isdigit() else None)
        for code, entry in iso4217.raw_table.items()
        if code and entry["CcyMnrUnts"]
    }


def country_codes() -> list[str]:
    return sorted(country.alpha_2 for country in pycountry.countries)


def source() -> str:
    units = minor_units()
    currency_lines = "".join(f"    {code!r}: {units[code]!r},\n" for code in sorted(units))
    codes = country_codes()
    country_lines = "".join(
        "    " + " ".join(f"{code!r}," for code in codes[i:i + 12]) + "\n"
        for i in range(0, len(codes), 12))
    return (
        '"""ISO 4217 currencies (minor units; None where ISO says "N.A.") and ISO 3166-1 alpha-2\n'
        f"country codes: written by scripts/iso_codes.py from iso4217 {iso4217.__version__} and\n"
        f'pycountry {pycountry.__version__}; do not edit."""\n\n'
        "CURRENCY_MINOR_UNITS: dict[str, int | None] = {\n" + currency_lines + "}\n\n"
        "COUNTRY_CODES = frozenset({\n" + country_lines + "})\n"
    )


if __name__ == "__main__":
    TARGET.write_text(source(), encoding="utf-8")
    print(f"wrote {TARGET}", file=sys.stderr)
