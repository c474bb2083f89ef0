"""PostgreSQL's own faults: the server ends Tally's connections, or cannot be reached.
A write that cannot be made is answered 503 (never 200 unstored), queued events wait and
are stored once the server answers again, and a bad URL stops Tally at start with one line."""

from __future__ import annotations

import subprocess
import uuid

import orjson
import pytest
import webtest

from app import create_app
from tests.conftest import BIN, REPO, WAIT, bearer, config_for, rows, run_cli
from tests.realparts import postgres_admin
from tests.routes import payment

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/test"


def end_connections(application_name: str) -> int:
    """What a server restart or a failover does to Tally's open connections."""
    admin = postgres_admin()
    try:
        return len(admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,)).fetchall())
    finally:
        admin.close()


@pytest.fixture
def app_on_postgres(postgres_schema, clock):
    name = f"tally_{uuid.uuid4().hex[:12]}"
    tally = create_app(config_for(f"{postgres_schema}&application_name={name}"), clock=clock)
    tally.application_name = name
    account = tally.directory.create_account("Faults", "scale")
    site = tally.directory.create_site(account["id"], ["example.com"])
    key = tally.directory.create_key(site["id"], ["events", "payments", "read"])
    yield tally, site, {**bearer(key["key"]), "Content-Type": "application/json"}
    tally.stop(timeout=5)


def test_connections_the_server_ended_are_replaced_and_nothing_is_lost(app_on_postgres):
    tally, _, headers = app_on_postgres
    client = webtest.TestApp(tally)
    client.post("/api/v1/payments", orjson.dumps(payment("pay_1")), headers=headers, status=200)
    assert end_connections(tally.application_name) >= 1
    client.post("/api/v1/payments", orjson.dumps(payment("pay_2")), headers=headers, status=200)
    assert [r["payment_id"] for r in rows(tally.config.database_url,
                                          "SELECT payment_id FROM payments ORDER BY 1")] == [
        "pay_1", "pay_2"]


def test_a_payment_while_the_server_is_unreachable_is_503_never_200(clock):
    tally = create_app(config_for(UNREACHABLE, busy_timeout_ms=300), clock=clock)
    try:
        refused = webtest.TestApp(tally).post(
            "/api/v1/payments", orjson.dumps(payment("pay_1")),
            headers={**bearer("tly_" + "x" * 43), "Content-Type": "application/json"},
            expect_errors=True)
    finally:
        tally.stop(timeout=5)
    assert refused.status_int == 503
    assert refused.json["error"]["code"] == "rate_limited"
    assert refused.headers["Retry-After"]


def test_queued_events_outlive_a_dropped_flush_connection(app_on_postgres):
    tally, site, headers = app_on_postgres
    client = webtest.TestApp(tally)
    body = {"s": site["id"], "b": [{"e": "pageview", "u": f"https://example.com/{n}"}
                                   for n in range(10)]}
    client.post("/api/v1/events", orjson.dumps(body), headers=headers, status=204)
    assert tally.flusher.flush_now(timeout=WAIT)
    assert end_connections(tally.application_name) >= 1  # the flush thread's among them
    client.post("/api/v1/events", orjson.dumps(body), headers=headers, status=204)
    assert tally.flusher.flush_now(timeout=WAIT)
    assert rows(tally.config.database_url, "SELECT count(*) AS n FROM events") == [{"n": 20}]


def test_an_unreachable_server_is_one_line_at_start(tmp_path):
    init = run_cli("init", db=UNREACHABLE, check=False)
    assert init.returncode == 1
    assert init.stderr.startswith("tally: cannot open database postgresql://postgres@127.0.0.1:1/test")
    assert init.stderr.count("\n") == 1
    gunicorn = subprocess.run(
        [str(BIN / "gunicorn"), "--bind", "127.0.0.1:0", "app:app"], cwd=REPO, timeout=60,
        capture_output=True, text=True, env={"PATH": str(BIN), "TALLY_DATABASE_URL": UNREACHABLE})
    assert gunicorn.returncode != 0
    assert "cannot open database postgresql://postgres@127.0.0.1:1/test" in gunicorn.stderr


def test_the_password_in_the_url_is_never_printed():
    secret_url = "postgresql://tally:s3cret-pass@127.0.0.1:1/test"
    init = run_cli("init", db=secret_url, check=False)
    assert init.returncode == 1
    assert "s3cret-pass" not in init.stderr + init.stdout
    assert "postgresql://tally:***@127.0.0.1:1/test" in init.stderr
