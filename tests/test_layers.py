"""The layers of the code (docs/DEVELOPING.md): each imports only its own package and the
layers below it, and SQL is written only in storage/ and the reports' query modules.

Both checks parse every source file with `ast` (imports inside functions count too).
"""

from __future__ import annotations

import ast
from pathlib import Path

from storage.connection import Connection, Cursor
from tests.conftest import REPO
from tests.test_sql_safety import SKIPPED_DIRS, SQL

# Bottom first. A module may import modules of its own top-level package and of any
# layer below its own; never one beside it or above it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("vocabulary", "config"),  # shared words and numbers; the settings (the only os.environ)
    ("tracker",),  # the tracking script, package data served at /js/tally.js
    ("metrics",),  # Prometheus instruments, called from any layer above
    ("validation",),  # pure checks of request bodies, Stripe's events, the values they return
    ("storage",),  # the ground floor of state: every table, every SQL statement
    ("quota",),  # plans, the monthly cap, usage held and stored, anonymous traffic's limits
    ("enrichment",),  # visitor ids, user agents, URL pieces
    ("attribution",),  # sources, channels, sessions, first touch
    ("reports",),  # figures for the stats endpoints and `tally report`
    ("ingest",),  # the events queue and its flush pipeline
    ("api",),  # HTTP resources
    ("dashboard",),  # server-rendered pages: sign-in, a user's sites, settings, shared links
    ("tasks",),  # the list of background duties and the thread that runs them
    ("app",),  # wiring: the WSGI application and its background services
    ("serving",),  # `tally serve`, its logger and the metrics folder of a server
    ("gunicorn.conf",),  # the server's hooks around the application
    ("cli",),  # the `tally` command
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}

# Tooling and the separate client library, outside the service: they may import anything.
OUTSIDE = {"tests", "bench", "scripts", "clients"}

# Modules that may hold SQL text besides storage/.
SQL_MODULES = {"reports/traffic/queries.py", "reports/money/queries.py",
               "reports/days/queries.py", "reports/segments/queries.py",
               "reports/funnels/queries.py"}

# Imports that still run up the layers, to be removed (the test fails when one is gone,
# so this list only shrinks).
KNOWN_UPWARD: set[tuple[str, str]] = set()
KNOWN_SQL_OUTSIDE_STORAGE: set[str] = set()


def source_files():
    for path in sorted(REPO.rglob("*.py")):
        parts = path.relative_to(REPO).parts
        if SKIPPED_DIRS & set(parts) or parts[0] in OUTSIDE:
            continue
        yield path


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    """The most specific name in LAYERS the module falls under (else its package)."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in RANK:
            return ".".join(parts[:end])
    return parts[0]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def upward_imports() -> tuple[set[tuple[str, str]], list[str]]:
    """(importer, imported) pairs that break the order; and modules in no layer."""
    ours = {layer_of(module_name(path)) for path in source_files()}
    wrong, unplaced = set(), []
    for path in source_files():
        module = module_name(path)
        layer = layer_of(module)
        if layer not in RANK:
            unplaced.append(module)
            continue
        for imported in imported_modules(path):
            target = layer_of(imported)
            if target not in ours or target == layer:
                continue
            if target not in RANK or RANK[target] >= RANK[layer]:
                wrong.add((module, imported))
    return wrong, unplaced


def test_every_module_has_a_layer():
    assert upward_imports()[1] == [], "add these to LAYERS in tests/test_layers.py and DEVELOPING"


def test_no_import_runs_up_the_layers():
    wrong = upward_imports()[0]
    new = sorted(wrong - KNOWN_UPWARD)
    assert not new, "these imports run up (or across) the layers: " + ", ".join(
        f"{a} -> {b}" for a, b in new)
    gone = sorted(KNOWN_UPWARD - wrong)
    assert not gone, f"fixed, so remove them from KNOWN_UPWARD: {gone}"


# The floors inside reports/, bottom first (docs/DEVELOPING.md, Layers).
REPORT_FLOORS: tuple[tuple[str, ...], ...] = (
    ("reports.shared",),  # parameters, CSV and text
    ("reports.money",),  # exact money, revenue, MRR and their SQL
    ("reports.traffic",),  # traffic figures, the realtime view and its SQL
    ("reports.days",),  # traffic per UTC day, stored once final
    ("reports.segments",),  # filters, goals, filtered traffic per day
    ("reports.funnels",),  # steps in order within a visit, then a payment; and their SQL
    ("reports.timeseries",),  # buckets, figures per bucket, changes
    ("reports.assembly",),  # each report put together
    ("reports.service",),  # the one entry point
)
REPORT_RANK = {name: rank for rank, names in enumerate(REPORT_FLOORS) for name in names}


def report_floor(module: str) -> str | None:
    parts = module.split(".")
    for end in range(len(parts), 1, -1):
        if ".".join(parts[:end]) in REPORT_RANK:
            return ".".join(parts[:end])
    return None


def test_no_import_runs_up_the_floors_of_reports():
    wrong, unplaced = [], []
    for path in sorted((REPO / "reports").rglob("*.py")):
        module = module_name(path)
        if module == "reports":
            continue
        floor = report_floor(module)
        if floor is None:
            unplaced.append(module)
            continue
        for imported in imported_modules(path):
            target = report_floor(imported)
            if target is not None and REPORT_RANK[target] > REPORT_RANK[floor]:
                wrong.append(f"{module} -> {imported}")
    assert unplaced == [], "add these to REPORT_FLOORS in tests/test_layers.py and DEVELOPING"
    assert wrong == [], "these imports run up the floors of reports/: " + ", ".join(wrong)


def test_storage_imports_nothing_above_it():
    for path in (REPO / "storage").glob("*.py"):
        for imported in imported_modules(path):
            layer = layer_of(imported)
            if layer in RANK and (module_name(path), imported) not in KNOWN_UPWARD:
                assert RANK[layer] <= RANK["storage"], f"{module_name(path)} imports {imported}"


def sql_texts(path: Path) -> list[int]:
    """Lines of string literals that look like SQL (docstrings and comments aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings and SQL.search(node.value)]


def test_sql_is_written_only_in_storage_and_the_report_queries():
    holders = set()
    for path in source_files():
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith("storage/") or relative in SQL_MODULES:
            continue
        if sql_texts(path):
            holders.add(relative)
    new = sorted(holders - KNOWN_SQL_OUTSIDE_STORAGE)
    assert not new, f"move this SQL into storage/ (one module per group of tables): {new}"
    gone = sorted(KNOWN_SQL_OUTSIDE_STORAGE - holders)
    assert not gone, f"no SQL left, so remove them from KNOWN_SQL_OUTSIDE_STORAGE: {gone}"


def test_the_checks_see_a_violation():
    """The scanners themselves: an upward import and a SQL string are found."""
    sample = ast.parse('from api.errors import x\nq = "SELECT a FROM t WHERE id = ?"\n')
    imports = {n.module for n in ast.walk(sample) if isinstance(n, ast.ImportFrom)}
    assert RANK[layer_of(next(iter(imports)))] > RANK["storage"]
    texts = [n.value for n in ast.walk(sample) if isinstance(n, ast.Constant)
             and isinstance(n.value, str) and SQL.search(n.value)]
    assert texts == ["SELECT a FROM t WHERE id = ?"]


def test_both_engines_connections_are_the_one_connection_type(store):
    """storage.connection.Connection, the type every layer above storage names, is true of
    the connections of both backends, and of the cursors they return."""
    conn = store.conn()
    assert isinstance(conn, Connection)
    assert isinstance(conn.execute("SELECT id FROM sites"), Cursor)
