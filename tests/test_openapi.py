"""docs/openapi.yaml: a valid OpenAPI 3.1 document that lists exactly the routes the app serves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from falcon import inspect
from openapi_spec_validator import validate

from api.openapi import OPENAPI_PATH, load_document
from app import create_app
from dashboard.routes import PAGE_ROUTES
from tests.conftest import REPO, config_for, database_env, is_postgres

DOCUMENT = load_document()
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}

# Operations the document describes before their issue has landed. Each entry turns
# green (XPASS) when the endpoint is served; then delete it here.
PENDING: dict[tuple[str, str], str] = {}


def template(path: str) -> str:
    """Falcon and OpenAPI both write parameters as {name}; names may differ."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def documented_operations(document: dict = DOCUMENT) -> set[tuple[str, str]]:
    return {
        (method.upper(), template(path))
        for path, item in document["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def served_operations(wsgi) -> set[tuple[str, str]]:
    """Responders the app defines; Falcon's own 405 and OPTIONS defaults are `internal`."""
    return {
        (method.method, template(route.path))
        for route in inspect.inspect_routes(wsgi)
        for method in route.methods
        if not method.internal
    }


# The dashboard's HTML pages, form posts and static files are not part of the JSON API the
# document describes; dashboard.routes.PAGE_ROUTES lists them, and only they are left out.
PAGE_OPERATIONS = {(method, template(path)) for method, path, _ in PAGE_ROUTES}


def operation_params():
    for operation in sorted(documented_operations()):
        reason = PENDING.get(operation)
        marks = [pytest.mark.xfail(reason=reason, strict=False)] if reason else []
        yield pytest.param(operation, marks=marks, id=" ".join(operation))


def test_document_is_valid_openapi_3_1():
    assert DOCUMENT["openapi"].startswith("3.1")
    validate(DOCUMENT)


def test_served_as_json_without_a_key(client):
    resp = client.get("/api/v1/openapi.json")
    assert resp.status_int == 200
    assert resp.content_type == "application/json"
    assert orjson.loads(resp.body) == DOCUMENT


def test_every_served_route_is_documented(tally):
    undocumented = served_operations(tally.wsgi) - documented_operations() - PAGE_OPERATIONS
    assert not undocumented, f"routes missing from docs/openapi.yaml: {sorted(undocumented)}"


def test_the_page_routes_left_out_are_served_and_not_in_the_document(tally):
    assert PAGE_OPERATIONS <= served_operations(tally.wsgi)
    assert not PAGE_OPERATIONS & documented_operations()
    assert all(not path.startswith("/api/") for _, path in PAGE_OPERATIONS)


@pytest.fixture(scope="module")
def served_on(module_database):
    """The operations an app on each backend serves, asked once per module and backend:
    starting an app per documented operation cost most of this module's CPU."""
    found = {}

    def served(backend: str) -> set[tuple[str, str]]:
        if backend not in found:
            app = create_app(config_for(module_database(backend)))
            try:
                found[backend] = served_operations(app.wsgi)
            finally:
                app.stop(timeout=5)
        return found[backend]

    return served


@pytest.mark.parametrize("operation", list(operation_params()))
def test_every_documented_operation_is_served(served_on, backend, operation):
    assert operation in served_on(backend)


def test_pending_list_names_only_documented_operations():
    assert set(PENDING) <= documented_operations()


def _operations(document: dict = DOCUMENT):
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                yield f"{method.upper()} {path}", operation




def resolve(node: dict, document: dict = DOCUMENT) -> dict:
    while isinstance(node, dict) and "$ref" in node:
        target = document
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


@pytest.mark.parametrize("name, operation", list(_operations()), ids=lambda v: v if isinstance(v, str) else "")
def test_each_operation_documents_its_errors(name, operation):
    responses = {status: resolve(r) for status, r in operation["responses"].items()}
    needs_key = operation.get("security", DOCUMENT["security"]) != []
    if needs_key:
        assert "401" in responses, f"{name} lacks 401"
        # The key is looked up in the database, which may be busy: 503, never 401 or 500.
        assert "503" in responses, f"{name} lacks 503"
    assert "500" in responses, f"{name} lacks 500"
    # gunicorn's refusals (request line, headers) can reach every route.
    assert "400" in responses and "431" in responses, f"{name} lacks 400 or 431"
    for status, response in responses.items():
        if status in ("429", "503"):
            assert "Retry-After" in response.get("headers", {}), f"{name} {status} lacks Retry-After"
        if status >= "400":
            schema = resolve(response["content"]["application/json"]["schema"])
            assert resolve(schema["allOf"][0]) is resolve(DOCUMENT["components"]["schemas"]["Error"])


@pytest.mark.empty_schema
def test_importing_app_opens_neither_the_document_nor_the_database(db_path):
    """The YAML is read at the first request, never at import, nor the database (its file,
    or the PostgreSQL schema the first connection would fill)."""
    probe = (
        "import sys\n"
        "opened = []\n"
        "sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == 'open' else None)\n"
        "import app\n"
        "print('\\n'.join(opened))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                          env={**database_env(db_path), "PATH": ""}, timeout=60, check=True)
    opened = proc.stdout.splitlines()
    assert any("app.cpython" in path or path.endswith("app.py") for path in opened), "the audit hook saw no import"
    assert str(OPENAPI_PATH) not in opened
    assert not any(path.startswith(db_path) for path in opened)
    project_files = [path for path in opened if path.startswith(str(REPO) + "/")
                     and not path.startswith(str(REPO / ".venv"))
                     and "/__pycache__/" not in path and not path.endswith((".py", ".pyc"))
                     and not Path(path).is_dir()]
    assert project_files == [], "importing app read data files (schema.sql, data lists...)"
    if is_postgres(db_path):
        import psycopg  # a bare connection: storage's own would apply the schema

        with psycopg.connect(db_path) as conn:
            assert conn.execute("SELECT count(*) FROM information_schema.tables"
                                " WHERE table_schema = current_schema()").fetchone() == (0,)
    else:
        assert not Path(db_path).exists()
