"""Under the real gunicorn of the default deployment: broken chunked framing, settings
out of range at start-up."""

from __future__ import annotations

import socket

import orjson
import pytest

from tests.conftest import WAIT, Server, provision, read_head
from tests.test_startup_faults import assert_refused

pytestmark = pytest.mark.slow


def serve(db: str):
    _, site, key = provision(db, name="H", plan="scale", host="example.com",
                             scopes=("events", "payments"))
    return Server(db, workers=2).wait_ready(), site["id"], key["key"]


@pytest.fixture(scope="module")
def servers(module_database):
    """One server per backend for the module, started when a test first asks."""
    started = {}

    def served_on(backend: str):
        if backend not in started:
            started[backend] = serve(module_database(backend))
        return started[backend]

    yield served_on
    for server, _, _ in started.values():
        server.stop()


@pytest.fixture
def served(servers, backend):
    """(server, site id, key): the module's server on the test's backend. Its tests store
    nothing, so they share it."""
    return servers(backend)


def raw_request(port: int, data: bytes, timeout: float = WAIT) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        head, _, body = read_head(sock).partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            piece = sock.recv(65536)
            if not piece:
                break
            body += piece
    return int(head.split(b" ")[1]), body


@pytest.mark.parametrize("path", ["/api/v1/events", "/api/v1/payments"])
@pytest.mark.parametrize("framing", [b"zz\r\nabc\r\n0\r\n\r\n", b"3\r\nabcXY0\r\n\r\n"])
def test_broken_chunked_framing_is_400_invalid_input(served, path, framing):
    """Item 4: it was a 500 with a traceback in the log."""
    server, _, key = served
    status, body = raw_request(server.port, (
        f"POST {path} HTTP/1.1\r\nHost: example.com\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode() + framing)
    assert status == 400, body
    error = orjson.loads(body)["error"]
    assert error == {"code": "invalid_input", "message": "invalid body: malformed chunked"
                     " transfer encoding, or the body was cut short"}
    assert "Traceback" not in server.log()


def test_gunicorn_refuses_a_queue_smaller_than_a_batch(db_path):
    """Item 6: TALLY_QUEUE_MAX=10 started, then every 20-event batch was 503 forever."""
    server = Server(db_path, workers=1, env={"TALLY_QUEUE_MAX": "10"})
    log = assert_refused(server, "TALLY_QUEUE_MAX must be between 50 (the largest batch one"
                                 " request may carry) and 1000000, not 10")
    assert log.count("refusing to start") == 1


def test_healthz_answers_while_idle_and_slow_clients_hold_connections(served):
    """Item 7: two idle TCP connections made a 2-worker service unresponsive for ~30 s."""
    server, _, _ = served
    held = []
    try:
        for _ in range(20):
            held.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        for _ in range(6):  # a body that never arrives in full
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(b"POST /api/v1/events HTTP/1.1\r\nHost: example.com\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n{")
            held.append(sock)
        for _ in range(5):
            # Well inside the 30 s after which gunicorn aborts a sync worker stuck on one.
            status, body = raw_request(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                                    b"Connection: close\r\n\r\n", timeout=25)
            assert status == 200, body
    finally:
        for sock in held:
            sock.close()
    assert "WORKER TIMEOUT" not in server.log()
