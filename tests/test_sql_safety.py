"""Every SQL statement is parameterized: no f-string, `%`, `.format` or `+` builds SQL.

The scan parses every Python file of the repo and flags a string that looks like SQL
when it is an f-string with a placeholder, the left side of `%`, the receiver of
`.format`, or one side of a `+` whose other side is not a literal. A statement that
must splice a fixed identifier (a whitelisted column or table name, a PRAGMA value,
a run of `?` placeholders) says so with a `# sql-safe: <why>` comment (ruff's
`# noqa: S608 <why>` also counts) on one of its lines; the reason is required.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import REPO

SKIPPED_DIRS = {".venv", ".git", "var", "build", "dist", "__pycache__", ".pytest_cache",
                ".hypothesis", "tally.egg-info", "results", "schemathesis-report"}
SQL = re.compile(
    r"\b(select\b[\s\S]*\bfrom|insert\s+(or\s+\w+\s+)?into|update\s+\w+\s+set|delete\s+from"
    r"|create\s+(table|index|view|trigger)|drop\s+(table|index)|alter\s+table|pragma\s+\w"
    r"|where\s+\w+\s*(=|<|>|in\b|like\b|is\b)|values\s*\(|order\s+by|group\s+by|limit\s+\d)",
    re.IGNORECASE,
)
MARKER = re.compile(r"#\s*(sql-safe:|noqa:\s*S608\b|fixed whitelist:)\s*[-:]?\s*\w")


def python_files(root: Path = REPO):
    for path in sorted(root.rglob("*.py")):
        if not SKIPPED_DIRS & set(path.relative_to(root).parts):
            yield path


def _literal_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    return None


def _is_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) or (
        isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values)
    )


def _looks_like_sql(node: ast.AST) -> bool:
    text = _literal_text(node)
    return text is not None and SQL.search(text) is not None


def string_built_sql(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place that builds SQL text out of values."""
    findings = []
    tree = ast.parse(source)
    lines = source.splitlines()
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.JoinedStr) and not _is_literal(node) and _looks_like_sql(node):
            what = "f-string"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and _looks_like_sql(node.left):
            what = "% formatting"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "format" and _looks_like_sql(node.func.value)):
            what = ".format"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            sides = (node.left, node.right)
            if any(_looks_like_sql(s) for s in sides) and not all(_is_literal(s) for s in sides):
                what = "+ concatenation"
        if what is None:
            continue
        span = lines[max(node.lineno - 2, 0):node.end_lineno]
        if not any(MARKER.search(line) for line in span):
            findings.append((node.lineno, what))
    return sorted(set(findings))


BAD = [
    'conn.execute(f"SELECT * FROM events WHERE site = {site}")',
    'conn.execute("SELECT * FROM events WHERE site = %s" % site)',
    'conn.execute("DELETE FROM events WHERE id = {}".format(x))',
    'conn.execute("UPDATE accounts SET plan = \'" + plan + "\'")',
    'sql = f"insert into events (a) values ({a})"',
    'conn.execute(f"PRAGMA busy_timeout = {ms}")',
    'q = ("SELECT a FROM t "\n     f"WHERE id = {i}")',
    'q = "SELECT a FROM t ORDER BY " + column',
]
GOOD = [
    'conn.execute("SELECT * FROM events WHERE site = ?", (site,))',
    'conn.execute("SELECT a FROM t " "WHERE id = ?", (i,))',
    'conn.execute("SELECT a FROM t " + "WHERE id = ?", (i,))',
    'raise NotFound(f"no account {account_id}")',
    'raise NotFound(f"no payment {payment_id} for this site")',
    'sql = f"INSERT INTO t VALUES ({marks})"  # noqa: S608 - placeholders only',
    'log.info("%s rows", n)',
    '# sql-safe: column comes from the fixed tuple COLUMNS\nq = f"SELECT {column} FROM t"',
    'q = f"SELECT {column} FROM t"  # sql-safe: column from the fixed tuple COLUMNS',
]


@pytest.mark.parametrize("snippet", BAD)
def test_detector_flags_string_built_sql(snippet):
    assert string_built_sql(snippet)


@pytest.mark.parametrize("snippet", GOOD)
def test_detector_passes_parameterized_sql(snippet):
    assert string_built_sql(snippet) == []


@pytest.mark.parametrize("comment", ["# sql-safe:", "# noqa: S608", "# sql-safe: ", "# todo"])
def test_marker_needs_a_reason(comment):
    assert string_built_sql(f'q = f"SELECT {{c}} FROM t"  {comment}')  # noqa: S608 - test data, never executed


def test_no_source_file_builds_sql_from_values():
    files = list(python_files())
    assert any(p.name == "directory.py" for p in files) and len(files) > 10
    findings = [
        f"{path.relative_to(REPO)}:{line}: SQL built by {what}"
        for path in files
        for line, what in string_built_sql(path.read_text(encoding="utf-8"))
    ]
    assert not findings, "parameterize these (or mark a fixed identifier with # sql-safe: why):\n" + "\n".join(findings)
