"""Payments against a real gunicorn: concurrent idempotent upserts and the body limit on the wire."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

from tests.conftest import WAIT, bearer, http, provision, rows, servers_per_backend
from tests.test_payments_http import FULL, body_of_size

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers(module_database):
    """One 4-worker server per backend for the module, started when a test first asks."""
    yield from servers_per_backend(module_database, workers=4)


@pytest.fixture
def served(servers, backend):
    """(server, key, count): the module's server on the test's backend and a site of the
    test's own, whose rows count(table) counts."""
    server, db = servers(backend)
    _, site, key = provision(db, host="shop.test", scopes=("payments",))
    key = key["key"]

    def count(table: str) -> int:
        sql = (f"SELECT count(*) AS n FROM {table} t"  # noqa: S608 - fixed names
               " JOIN sites s ON s.id = t.site_id WHERE s.public_id = ?")
        return rows(db, sql, (site["id"],))[0]["n"]

    return server, key, count


def test_32_concurrent_identical_payments_store_one(served):
    server, key, count = served
    body = orjson.dumps(FULL)
    headers = {**bearer(key), "Content-Type": "application/json"}

    def send(_):
        return http("POST", server.url + "/api/v1/payments", body, headers)

    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(send, range(32)))
    assert [status for status, _, _ in answers] == [200] * 32, [b for _, _, b in answers]
    assert {orjson.loads(b)["data"]["payment_id"] for _, _, b in answers} == {FULL["payment_id"]}
    for table in ("payments", "customers", "subscriptions", "subscription_observations"):
        assert count(table) == 1, table


def raw_request(server, head: str, body: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65_536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def test_content_length_over_the_limit_is_refused_without_reading_the_body(served):
    server, key, count = served
    head = ("POST /api/v1/payments HTTP/1.1\r\nHost: shop.test\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000000\r\nConnection: close\r\n")
    # Only a few bytes follow a claim of 100 MB: the answer comes without waiting for the rest.
    answer = raw_request(server, head, b'{"payment_id": ')
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b'"code":"invalid_input"' in answer
    assert count("payments") == 0


@pytest.mark.parametrize("size, status", [(65_536, 200), (65_537, 413)])
def test_64_kib_edge_through_gunicorn(served, size, status):
    server, key, count = served
    headers = {**bearer(key), "Content-Type": "application/json"}
    got, _, body = http("POST", server.url + "/api/v1/payments", body_of_size(size), headers)
    assert got == status, body
    assert count("payments") == (1 if status == 200 else 0)
