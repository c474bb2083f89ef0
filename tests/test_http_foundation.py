"""The shared HTTP behaviour: keys, scopes and one error envelope on every path."""

from __future__ import annotations

import orjson
import pytest

from tests.conftest import WAIT, bearer, cli_json, http


def assert_envelope(resp, status: int, code: str) -> dict:
    assert resp.status_int == status
    assert resp.content_type == "application/json"
    body = orjson.loads(resp.body)
    assert set(body) == {"ok", "error"} and body["ok"] is False
    assert set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code and body["error"]["message"]
    return body["error"]


def test_health_needs_no_key(client):
    assert client.get("/healthz").json == {"ok": True, "data": {"status": "ok"}}


def test_key_endpoint_describes_the_key(client, site):
    resp = client.get("/api/v1/key", headers=bearer(site["key"]))
    assert resp.json == {"ok": True, "data": {"id": site["key_id"], "site": site["site"]["id"],
                                              "scopes": ["events", "payments", "read"]}}


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Basic dXNlcjpwYXNz", "Bearer tly_short", "Bearer " + "tly_" + "A" * 43,
     "Token tly_" + "A" * 43],
)
def test_missing_malformed_or_unknown_key_is_401(client, site, header):
    headers = {} if header is None else {"Authorization": header}
    resp = client.get("/api/v1/key", headers=headers, expect_errors=True)
    assert_envelope(resp, 401, "unauthorized")


def test_revoked_key_is_refused_within_a_second(client, site, directory, clock):
    assert client.get("/api/v1/key", headers=bearer(site["key"])).status_int == 200
    directory.revoke_key(site["key_id"])
    clock.advance(1.01)
    resp = client.get("/api/v1/key", headers=bearer(site["key"]), expect_errors=True)
    assert_envelope(resp, 401, "unauthorized")


def test_unknown_route_is_404_envelope(client):
    assert_envelope(client.get("/nope", expect_errors=True), 404, "not_found")
    assert_envelope(client.get("/api/v1/nope", expect_errors=True), 404, "not_found")


def test_wrong_method_is_405_envelope(client, site):
    resp = client.delete("/api/v1/key", headers=bearer(site["key"]), expect_errors=True)
    assert_envelope(resp, 405, "method_not_allowed")
    assert "GET" in resp.headers["Allow"]


def test_unexpected_failure_is_500_without_internals(tally, client, caplog):
    class Boom:
        def on_get(self, req, resp):
            raise RuntimeError("secret internals: /etc/passwd")

    tally.wsgi.add_route("/boom", Boom())
    resp = client.get("/boom", expect_errors=True)
    error = assert_envelope(resp, 500, "internal_error")
    assert "secret" not in error["message"]
    assert "secret internals" in caplog.text


@pytest.mark.slow
def test_cli_and_several_workers_share_one_file(db_path, server_factory):
    account = cli_json("account", "create", "--name", "A", db=db_path)
    site = cli_json("site", "create", "--account", account["id"], "--host", "a.test", db=db_path)
    server = server_factory(db_path, workers=3)
    key = cli_json("key", "create", "--site", site["id"], "--scope", "read", db=db_path)
    for _ in range(12):
        status, headers, body = http("GET", server.url + "/api/v1/key", headers=bearer(key["key"]))
        assert status == 200 and orjson.loads(body)["data"]["site"] == site["id"]
    cli_json("key", "revoke", key["id"], db=db_path)
    import time

    time.sleep(1.2)
    for _ in range(12):
        status, headers, body = http("GET", server.url + "/api/v1/key", headers=bearer(key["key"]))
        assert status == 401
        assert orjson.loads(body)["error"]["code"] == "unauthorized"
    status, headers, body = http("GET", server.url + "/nope")
    assert status == 404 and headers["Content-Type"] == "application/json"


@pytest.mark.slow
@pytest.mark.sqlite_only  # a folder where the SQLite file should be
def test_gunicorn_refuses_to_start_on_an_unusable_database(tmp_path):
    from tests.conftest import Server

    bad = tmp_path / "adir.db"
    bad.mkdir()
    server = Server(str(bad), workers=1)
    assert server.proc.wait(WAIT) != 0
    assert "cannot open database" in server.log()
