"""Chunked request bodies (no Content-Length) are read, and still bounded, under gunicorn."""

from __future__ import annotations

import http.client

import orjson
import pytest

from tests.conftest import WAIT, provision


def _chunked_post(server, path, body: bytes, key: str):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
    conn.putrequest("POST", path)
    conn.putheader("Authorization", f"Bearer {key}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    try:
        for start in range(0, len(body), 1000):
            chunk = body[start:start + 1000]
            conn.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        conn.send(b"0\r\n\r\n")
    except BrokenPipeError:
        pass  # the server answered (413) and closed without reading the rest: read its answer
    resp = conn.getresponse()
    result = resp.status, resp.read()
    conn.close()
    return result


@pytest.mark.slow
def test_chunked_bodies_are_read_and_bounded(db_path, server_factory):
    _, site, key = provision(db_path, name="A", host="a.test", scopes=("payments",))
    key = key["key"]
    server = server_factory(db_path, workers=1)
    payment = {"payment_id": "chunked-1", "customer": {"id": "c1"}, "amount": 10,
               "currency": "EUR", "kind": "charge", "paid_at": "2026-01-31T09:30:00Z"}
    status, body = _chunked_post(server, "/api/v1/payments", orjson.dumps(payment), key)
    assert status == 200, body
    assert orjson.loads(body) == {"ok": True, "data": {"payment_id": "chunked-1"}}

    padded = dict(payment, metadata={"pad": "x" * 70_000})
    status, body = _chunked_post(server, "/api/v1/payments", orjson.dumps(padded), key)
    assert status == 413
    assert orjson.loads(body)["error"]["code"] == "invalid_input"
