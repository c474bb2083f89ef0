"""Every statement storage speaks is declared through storage.statements, and every declared
statement can run on each engine it is declared for: SQLite EXPLAINs it against a fresh
schema, PostgreSQL PREPAREs it in a fresh schema. The compiler's handling of inputs the old
regular-expression translator got wrong is pinned here too."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import psycopg
import pytest

from storage.statements import (
    REGISTRY,
    Fragment,
    Statement,
    UnsupportedSQL,
    by_dialect,
    compose,
    fragment,
    parameter_count,
    statement,
    translate,
    translate_native,
)

REPO = Path(__file__).resolve().parent.parent
# The packages whose modules declare statements (reports' query modules, storage, and the
# flush's SparseInsert users).
DECLARING_PACKAGES = ("storage", "reports", "attribution", "ingest")
# Modules that speak to one engine's machinery directly (applying the schema, transactions,
# PRAGMAs on a connection being opened, copying between engines with psycopg.sql): they
# never run a statement of the shared subset.
ENGINE_MACHINERY = {"storage/db.py", "storage/postgres.py", "storage/migrations.py",
                    "storage/transfer.py"}


def _import_all() -> None:
    for package in DECLARING_PACKAGES:
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{package}."):
            importlib.import_module(info.name)


_import_all()
PROBES = list(REGISTRY)


def _id(probe) -> str:
    return f"{probe.module}:{' '.join(probe.sql.split())[:60]}"


def test_the_registry_holds_every_modules_statements():
    modules = {probe.module for probe in PROBES}
    assert {"storage.users", "storage.payments", "storage.sessions",
            "storage.maintenance"} <= modules
    assert len(PROBES) > 100


@pytest.fixture(scope="module")
def sqlite_conn(tmp_path_factory):
    from storage.db import Database

    db = Database(str(tmp_path_factory.mktemp("statements") / "tally.db"))
    conn = db.connect()
    yield conn
    conn.close()


@pytest.fixture(scope="module")
def postgres_conn():
    from storage.postgres import PostgresDatabase
    from tests.conftest import new_postgres_schema

    with new_postgres_schema() as url:
        conn = PostgresDatabase(url).connect()
        yield conn.raw
        conn.close()


@pytest.mark.parametrize("probe", [p for p in PROBES if "sqlite" in p.engines], ids=_id)
def test_every_statement_prepares_on_sqlite(sqlite_conn, probe):
    sqlite_conn.execute("EXPLAIN " + probe.sql, (None,) * parameter_count(probe.sql))


def _numbered(text: str) -> str:
    """psycopg's %s placeholders as PostgreSQL's $1, $2, ... (and %% as %)."""
    count = iter(range(1, 10_000))
    return re.sub(r"%(s|%)", lambda m: f"${next(count)}" if m.group(1) == "s" else "%", text)


# The types Tally's values bind as (storage/postgres.py): a str is untyped, an int bigint,
# a list parameter text[] or bigint[]. A statement prepares if one assignment fits it.
_TYPINGS = (("unknown", "text[]"), ("unknown", "bigint[]"), ("bigint", "text[]"),
            ("bigint", "bigint[]"))


@pytest.mark.parametrize("probe", [p for p in PROBES if "postgres" in p.engines], ids=_id)
def test_every_statement_prepares_on_postgres(postgres_conn, probe):
    compiled = translate_native(probe.sql) if probe.postgres_native else translate(probe.sql)
    text = _numbered(compiled.text)
    placeholders = sum(m.group(1) == "s" for m in re.finditer(r"%(s|%)", compiled.text))
    errors = []
    for scalar, array in _TYPINGS:
        types = [array if i in compiled.lists else scalar for i in range(placeholders)]
        signature = f"({', '.join(types)})" if types else ""
        try:
            postgres_conn.execute(f"PREPARE tally_probe{signature} AS {text}", prepare=False)
            postgres_conn.execute("DEALLOCATE tally_probe")
            return
        except psycopg.errors.Error as exc:
            errors.append(" ".join(str(exc).split()))
    pytest.fail(f"{errors[0]} | with bigint parameters: {errors[-1]}")


def _literal_sql(node: ast.expr) -> bool:
    """Whether an argument is SQL text made on the spot rather than a declared name."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp):
        return _literal_sql(node.left) or _literal_sql(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in ("format", "join", "replace") and _literal_sql(node.func.value)
    return False


def _query_modules() -> list[Path]:
    found = sorted((REPO / "storage").glob("*.py"))
    found += sorted(p for p in (REPO / "reports").rglob("*.py") if "quer" in p.name)
    return [p for p in found if str(p.relative_to(REPO)) not in ENGINE_MACHINERY]


def test_storage_executes_only_declared_statements():
    made_on_the_spot = []
    for path in _query_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("execute", "executemany", "executescript")
                    and node.args and _literal_sql(node.args[0])):
                made_on_the_spot.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert made_on_the_spot == []


_SQL_TEXT = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|REPLACE)\b", re.IGNORECASE)


def _undeclared_sql(value, declared: set[str]) -> bool:
    if isinstance(value, Statement | Fragment):
        return False
    if isinstance(value, str):
        # A text with {slots} is the source of declared statements (filled, then declared);
        # a text declared as well is the same statement kept under a second name.
        return bool(_SQL_TEXT.match(value)) and "{" not in value and value not in declared
    if isinstance(value, dict):
        return any(_undeclared_sql(v, declared) for v in value.values())
    return False


def test_no_query_module_keeps_sql_text_outside_the_registry():
    """A statement kept in a module-level name (or a dict of them) and executed later
    escapes the scan above: every such text must be declared."""
    modules = {".".join(path.relative_to(REPO).with_suffix("").parts): None
               for path in _query_modules()}
    for name in modules:
        modules[name] = importlib.import_module(name)
    declared = {probe.sql for probe in REGISTRY}  # complete once every module is imported
    undeclared = [f"{name}.{attr}" for name, module in modules.items()
                  for attr, value in vars(module).items() if _undeclared_sql(value, declared)]
    assert undeclared == []


def test_the_scan_sees_literals_in_every_form():
    for source in ('c.execute("SELECT 1")', 'c.execute(f"SELECT {x}")',
                   'c.execute("SELECT " + x)', 'c.execute("SELECT {}".format(x))'):
        call = ast.parse(source).body[0].value
        assert _literal_sql(call.args[0]), source
    assert not _literal_sql(ast.parse("c.execute(_DECLARED)").body[0].value.args[0])


# --- what the old translator got wrong ----------------------------------------------------

def test_commas_inside_quotes_leave_an_aggregate_max_alone():
    compiled = translate("SELECT max(CASE WHEN a = 'x,y' THEN 1 END) FROM t")
    assert compiled.text == "SELECT max(CASE WHEN a = 'x,y' THEN 1 END) FROM t"
    assert translate("SELECT max(a, ?) FROM t").text == "SELECT GREATEST(a, %s) FROM t"


def test_json_each_of_a_parameter_before_order_by_takes_no_alias():
    compiled = translate("SELECT value FROM json_each(?) ORDER BY value")
    assert compiled.text == "SELECT value FROM unnest(%s) AS json_each(value) ORDER BY value"
    assert compiled.lists == {0}


def test_insert_or_ignore_before_a_comment_keeps_its_conflict_clause():
    compiled = translate("INSERT OR IGNORE INTO t (a) VALUES (?) -- one per a")
    assert compiled.text.split("--")[0].rstrip().endswith("ON CONFLICT DO NOTHING")
    assert "INSERT OR" not in compiled.text


def test_postgresql_text_keeps_insert_or_update_of_a_trigger():
    text = "CREATE TRIGGER t BEFORE INSERT OR UPDATE ON events FOR EACH ROW EXECUTE FUNCTION f()"
    assert translate_native(text).text == text


def test_a_function_name_inside_a_literal_is_left_alone():
    compiled = translate("SELECT 'instr(' || instr(a, ?) FROM t")
    assert compiled.text == "SELECT 'instr(' || strpos(a, %s) FROM t"


@pytest.mark.parametrize("sql", [
    "INSERT OR REPLACE INTO t (a) VALUES (?)",
    "REPLACE INTO t (a) VALUES (?)",
    "INSERT OR ABORT INTO t (a) VALUES (?)",
    "SELECT a FROM t WHERE a GLOB ?",
    "SELECT iif(a, 1, 2) FROM t",
    "SELECT strftime('%Y', a) FROM t",
    "SELECT a::text FROM t",
    "SELECT a FROM t WHERE a IS ?",
    "SELECT a FROM t WHERE a LIKE ?",
    "SELECT a FROM t WHERE a = ?1 OR a = ?",
    "SELECT 'unterminated FROM t",
    "SELECT (a FROM t",
    "SELECT CAST(a AS BLOB) FROM t",
    "SELECT a FROM t ORDER BY a COLLATE NOCASE",
    "SELECT CURRENT_TIMESTAMP",
])
def test_constructs_outside_the_closed_list_are_refused(sql):
    with pytest.raises(UnsupportedSQL):
        translate(sql)


def test_a_refused_statement_is_in_the_probes_and_fails_on_postgresql():
    """Compiled on first use, so a process on SQLite never pays for it; the probes above
    compile every declared statement, so the suite fails on it before any deployment."""
    refused = statement("INSERT OR REPLACE INTO t (a) VALUES (?)")
    try:
        assert REGISTRY[-1].sql == refused
        with pytest.raises(UnsupportedSQL):
            refused.postgres  # noqa: B018 - compiling is the point
    finally:
        REGISTRY.pop()


def test_placeholders_literals_and_comments():
    compiled = translate("SELECT '50%', ?2 FROM t WHERE a = ?1 AND ?2 IS NULL -- 5%")
    assert compiled.text == "SELECT '50%%', %s FROM t WHERE a = %s AND (%s = 1) -- 5%%"
    assert compiled.order == (1, 0, 1)
    assert compiled.null_tests == {2}
    assert compiled.arguments(("a", None)) == [None, "a", True]


def test_in_a_json_list_is_any_of_the_list():
    compiled = translate("SELECT 1 FROM t WHERE a NOT IN (SELECT value FROM json_each(?))"
                         " AND b IN (SELECT value FROM json_each(?))")
    assert compiled.text == "SELECT 1 FROM t WHERE a <> ALL(%s) AND b = ANY(%s)"
    assert compiled.arguments(('["x"]', "[1, 2]")) == [["x"], [1, 2]]


def test_integer_casts_keep_64_bits():
    assert translate("SELECT CAST(a AS INTEGER) FROM t").text == "SELECT CAST(a AS BIGINT) FROM t"


def test_dialect_statements_run_only_on_their_engine():
    declared = by_dialect(sqlite="SELECT 1", postgres="SELECT 1::bigint")
    assert declared["sqlite"].postgres is None
    assert declared["postgres"].postgres.text == "SELECT 1::bigint"


def test_composed_statements_take_declared_pieces_only():
    where = fragment("a = ?", probe="SELECT 1 FROM sites WHERE {}")
    assert isinstance(where, Fragment)
    made = compose(Fragment("SELECT 1 FROM t WHERE "), where)
    assert made.postgres.text == "SELECT 1 FROM t WHERE a = %s"
    with pytest.raises(TypeError):
        compose("SELECT 1 FROM t WHERE ", where)
    with pytest.raises(TypeError):
        where.format("1 = 1")
    REGISTRY.pop()  # the probe above is this test's own


def test_prepare_catches_what_only_postgres_refuses(postgres_conn):
    with pytest.raises(psycopg.errors.UndefinedFunction):
        postgres_conn.execute("PREPARE tally_probe AS SELECT no_such_function(1)",
                              prepare=False)
    postgres_conn.execute("ROLLBACK") if postgres_conn.info.transaction_status else None
