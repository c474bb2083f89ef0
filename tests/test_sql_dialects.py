"""SQL spelled once for both backends gives the same values on both: PostgreSQL's
respellings in storage.statements.translate and the fragments of storage.dialect."""

from __future__ import annotations

import pytest

from storage.dialect import integer_of_text
from storage.statements import REGISTRY, by_dialect, translate
from tests.conftest import is_postgres, rows


def test_case_mapping_takes_the_c_collation_outside_literals():
    text = translate("SELECT upper(lower(a || ?)) FROM t WHERE b = 'lower(x)' AND \"lower(\" = 1")
    assert text.text == ('SELECT upper((lower((a || %s) COLLATE "C")) COLLATE "C") FROM t'
                         " WHERE b = 'lower(x)' AND \"lower(\" = 1")


def test_lower_and_upper_change_only_ascii_letters(db_path):
    assert rows(db_path, "SELECT lower(?) AS low, upper(?) AS up", ("ÉA", "éa")) == [
        {"low": "Éa", "up": "éA"}]


@pytest.mark.parametrize(("text", "integer"), [
    ("42", 42), (" \t42abc", 42), ("+7", 7), ("-0012", -12), ("4.2e1", 4), ("abc", 0),
    ("", 0), ("- 5", 0), ("99999999999999999999", 2**63 - 1),
    ("-99999999999999999999", -2**63),
])
def test_integer_of_text_is_sqlites_cast(db_path, text, integer):
    name = "postgres" if is_postgres(db_path) else "sqlite"
    sql = f"SELECT {integer_of_text(name, '?')} AS n"  # noqa: S608 - a fixed fragment
    declared = by_dialect(sqlite=sql, postgres=sql)[name]
    REGISTRY[-2:] = []  # the test's own
    assert rows(db_path, declared, (text,)) == [{"n": integer}]
