"""validation/iso_codes.py, the table the service reads instead of importing iso4217 and
pycountry, says what the pinned packages say (scripts/iso_codes.py writes it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import BIN, REPO


def test_the_table_is_what_the_packages_give_today():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import iso_codes
    finally:
        sys.path.remove(str(REPO / "scripts"))
    written = (REPO / "validation" / "iso_codes.py").read_text(encoding="utf-8")
    assert written == iso_codes.source(), "run: .venv/bin/python scripts/iso_codes.py"


@pytest.mark.parametrize(("code", "units"), [
    ("USD", 2), ("JPY", 0), ("KWD", 3), ("CLF", 4), ("XAU", None), ("XTS", None)])
def test_minor_units_as_iso_publishes_them(code, units):
    from validation.iso_codes import CURRENCY_MINOR_UNITS

    assert CURRENCY_MINOR_UNITS[code] == units


def test_the_service_imports_neither_package():
    """The point of the table: importing the app costs no XML parse or distribution scan."""
    probe = ("import sys, app; "
             "print(sorted(m for m in ('iso4217', 'pycountry', 'yaml') if m in sys.modules))")
    proc = subprocess.run([str(BIN / "python"), "-c", probe], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={"TALLY_DB": ":memory:", "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
