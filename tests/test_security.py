"""Keys at rest, secrets in logs, gunicorn's request limits and bounded JSON nesting."""

from __future__ import annotations

import runpy
import socket
from pathlib import Path

import orjson
import pytest

from api.bodies import MAX_JSON_DEPTH, parse_json
from api.errors import ApiError
from tests.conftest import REPO, WAIT, bearer, cli_json, connect, http, is_postgres
from tests.routes import sample_request, served_now
from tests.test_openapi import PENDING

# JSON nesting --------------------------------------------------------------


def nested(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


@pytest.mark.parametrize("body", [nested(1), nested(MAX_JSON_DEPTH), b"[" * 64 + b"]" * 64,
                                  b'{"t": "' + b"[{" * 500 + b'"}'])
def test_nesting_up_to_the_bound_parses(body):
    parse_json(body)


@pytest.mark.parametrize("body", [nested(MAX_JSON_DEPTH + 1), b"[" * 65 + b"]" * 65,
                                  b"[" * 1024 + b"]" * 1024, b"[" * 5000 + b"]" * 5000])
def test_deeper_nesting_is_invalid_json(body):
    with pytest.raises(ApiError) as caught:
        parse_json(body)
    assert caught.value.status == 400 and caught.value.code == "invalid_input"
    assert caught.value.message.startswith("invalid JSON:")


JSON_BODY_OPERATIONS = [
    pytest.param(op, marks=[pytest.mark.xfail(reason=PENDING[op], strict=False)]
                 if op in PENDING else [], id=" ".join(op))
    for op in [("POST", "/api/v1/payments"), ("POST", "/api/v1/events")]
]


@pytest.mark.parametrize("operation", JSON_BODY_OPERATIONS)
@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 1000, 3000])
def test_deep_bodies_are_refused_with_the_envelope(client, site, operation, levels):
    method, path = operation
    resp = client.request(path, method=method, body=b"[" * levels + b"]" * levels,
                          headers={**bearer(site["key"]), "Content-Type": "application/json"},
                          expect_errors=True)
    assert resp.status_int == 400, resp.body
    assert resp.json["error"]["code"] == "invalid_input"
    assert resp.json["error"]["message"].startswith("invalid JSON:")


# Keys at rest --------------------------------------------------------------


def stored_bytes(db: str) -> bytes:
    """Everything the database holds: SQLite's files byte for byte (free pages too), or
    every row of every table of the test's PostgreSQL schema as text."""
    if not is_postgres(db):
        folder = Path(db).parent
        return b"".join(p.read_bytes() for p in folder.iterdir()
                        if p.name.startswith(Path(db).name))
    from psycopg import sql

    conn = connect(db)
    try:
        tables = [row[0] for row in conn.raw.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema()")]
        assert "api_keys" in tables
        return b"".join(
            repr(conn.raw.execute(sql.SQL("SELECT t::text FROM {} t").format(
                sql.Identifier(name))).fetchall()).encode() for name in tables)
    finally:
        conn.close()


def test_only_the_hash_of_a_key_is_stored(db_path):
    db = db_path
    account = cli_json("account", "create", "--name", "A", db=db)
    site = cli_json("site", "create", "--account", account["id"], "--host", "a.test", db=db)
    key = cli_json("key", "create", "--site", site["id"], "--scope", "events", db=db)
    secret = key["key"]
    assert secret.startswith("tly_") and len(secret) == 47
    listed = cli_json("key", "list", db=db)
    assert secret not in orjson.dumps(listed).decode()
    stored = stored_bytes(db)
    assert key["id"].encode() in stored  # the key's row is there to be searched
    assert secret.encode() not in stored and secret[4:].encode() not in stored


# gunicorn limits -------------------------------------------------------------


def test_gunicorn_conf_bounds_requests_and_workers():
    conf = runpy.run_path(str(REPO / "gunicorn.conf.py"))
    assert 0 < conf["limit_request_line"] <= 2048
    assert 0 < conf["limit_request_fields"] <= 50
    assert 0 < conf["limit_request_field_size"] <= 4096
    assert 0 < conf["timeout"] <= 60
    # The drain on SIGTERM must fit in the graceful timeout.
    assert conf["graceful_timeout"] > 5


def raw_request(port: int, request_line: str, headers: list[tuple[str, str]]) -> bytes:
    head = "".join(f"{name}: {value}\r\n" for name, value in headers)
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as conn:
        conn.sendall(f"{request_line}\r\nHost: t\r\nConnection: close\r\n{head}\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


@pytest.mark.slow
def test_gunicorn_refuses_oversized_requests_before_the_app(db_path, server_factory):
    server = server_factory(db_path, workers=1)
    port = server.port
    cases = [
        # (request line, extra headers, accepted?)
        ("GET /healthz?" + "a" * 1960 + " HTTP/1.1", [], True),
        ("GET /healthz?" + "a" * 2100 + " HTTP/1.1", [], False),
        ("GET /healthz HTTP/1.1", [(f"X-H{i}", "v") for i in range(48)], True),  # 50 fields
        ("GET /healthz HTTP/1.1", [(f"X-H{i}", "v") for i in range(49)], False),  # 51 fields
        ("GET /healthz HTTP/1.1", [("X-Big", "v" * 4000)], True),
        ("GET /healthz HTTP/1.1", [("X-Big", "v" * 4200)], False),
    ]
    for line, headers, accepted in cases:
        answer = raw_request(port, line, headers)
        status = status_of(answer)
        if accepted:
            assert status == 200, (line[:40], len(headers))
            continue
        # gunicorn refuses it before the app, still in the envelope (api/wire_errors.py).
        assert status in (400, 431), (line[:40], len(headers), status)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"\r\nContent-Type: application/json\r\n" in head
        error = orjson.loads(body)["error"]
        assert error["code"] == "invalid_input" and error["message"]
    assert http("GET", server.url + "/healthz")[0] == 200


def test_wire_errors_use_the_envelope_and_hide_internals():
    class Sock:
        sent = b""

        def gettimeout(self):
            return 0.0

        def sendall(self, data):
            Sock.sent += data

    from api.wire_errors import write_json_error

    write_json_error(Sock(), 500, "Internal Server Error", "Traceback: secret internals")
    head, _, body = Sock.sent.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert orjson.loads(body) == {"ok": False, "error": {"code": "internal_error",
                                                         "message": "internal server error"}}
    assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) == len(body)


# Secrets in logs -------------------------------------------------------------


@pytest.mark.slow
def test_a_full_request_cycle_logs_no_secret(db_path, server_factory):
    account = cli_json("account", "create", "--name", "A", db=db_path)
    site = cli_json("site", "create", "--account", account["id"], "--host", "example.com",
                    db=db_path)
    key = cli_json("key", "create", "--site", site["id"], "--scope", "events", "--scope",
                   "payments", "--scope", "read", db=db_path)
    secret = key["key"]
    server = server_factory(db_path, workers=2, env={
        "GUNICORN_CMD_ARGS": "--access-logfile=- --error-logfile=- --log-level=debug",
        "TALLY_LOG_LEVEL": "DEBUG",
    })
    headers_variants = [
        bearer(secret),
        {"Authorization": f"Token {secret}"},
        {"Authorization": f"Bearer {secret}x"},
        {"Authorization": f"Bearer {secret} {secret}"},
        {"Authorization": secret},
    ]
    walked = served_now()
    assert len(walked) >= 3
    for method, path in walked:
        method, concrete, body = sample_request(method, path, site["id"])
        for headers in headers_variants:
            http(method, server.url + concrete, body, {**headers, "Content-Type": "application/json"})
        if body is not None:
            # A malformed body that carries the secret, and one with an unknown field named after it.
            http(method, server.url + concrete, b'{"k": "' + secret.encode() + b'"',
                 bearer(secret))
            http(method, server.url + concrete, orjson.dumps({secret: 1}), bearer(secret))
    cli_json("key", "revoke", key["id"], db=db_path)
    for method, path in walked:
        method, concrete, body = sample_request(method, path, site["id"])
        http(method, server.url + concrete, body, bearer(secret))
    server.stop()
    log = server.log()
    assert '"GET /api/v1/key HTTP/1.1" 200' in log, "the access log was not captured"
    assert "Booting worker" in log and "Shutting down" in log
    assert secret not in log and secret[4:] not in log and secret[4:24] not in log
