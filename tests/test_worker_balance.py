"""gunicorn's workers share one listening socket and a keep-alive connection stays with the
worker that accepted it: serving/worker.py has a worker holding more than its share of all
workers' connections leave a new one to another worker, and take it itself when no other
does (a worker stopped or busy)."""

from __future__ import annotations

import os
import signal
import socket

import pytest

from tests.conftest import WAIT, wait_until

pytestmark = pytest.mark.slow

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: tally\r\nConnection: keep-alive\r\n\r\n"


def _workers(master: int) -> list[int]:
    with open(f"/proc/{master}/task/{master}/children") as children:
        return [int(pid) for pid in children.read().split()]


def _connections_held(pids: list[int], port: int) -> dict[int, int]:
    """How many established connections to `port` each process holds."""
    inodes = set()
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":
                inodes.add(fields[9])
    held = {}
    for pid in pids:
        folder = f"/proc/{pid}/fd"
        targets = []
        for fd in os.listdir(folder):
            try:
                targets.append(os.readlink(f"{folder}/{fd}"))
            except OSError:
                pass  # closed meanwhile
        held[pid] = sum(1 for target in targets
                        if target.startswith("socket:[") and target[8:-1] in inodes)
    return held


def _answered(sock: socket.socket) -> bytes:
    sock.settimeout(WAIT)
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        if not chunk:
            break
        answer += chunk
    return answer


def _connect(port: int, count: int) -> list[socket.socket]:
    """`count` connections opened at once, then a request on each, each answered."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=WAIT) for _ in range(count)]
    for sock in socks:
        sock.sendall(REQUEST)
    for sock in socks:
        assert _answered(sock).startswith(b"HTTP/1.1 200")
    return socks


def _wait_held(pids: list[int], port: int, total: int) -> dict[int, int]:
    wait_until(lambda: sum(_connections_held(pids, port).values()) >= total)
    return _connections_held(pids, port)


def test_a_burst_of_keep_alive_connections_is_shared_by_both_workers(server_factory, tmp_path):
    server = server_factory(str(tmp_path / "tally.db"), workers=2)
    pids = _workers(server.proc.pid)
    assert len(pids) == 2
    socks = _connect(server.port, 16)
    try:
        held = _wait_held(pids, server.port, 16)
        assert sum(held.values()) == 16
        assert min(held.values()) >= 3, held
    finally:
        for sock in socks:
            sock.close()


def test_with_the_other_worker_stopped_a_worker_over_its_share_still_takes_every_connection(
        server_factory, tmp_path):
    server = server_factory(str(tmp_path / "tally.db"), workers=2)
    pids = _workers(server.proc.pid)
    first = _connect(server.port, 4)
    held = _wait_held(pids, server.port, 4)
    busy = max(held, key=held.get)
    stopped = next(pid for pid in pids if pid != busy)
    os.kill(stopped, signal.SIGSTOP)
    try:
        # the stopped worker can accept nothing: every new connection is the other's, over
        # its share or not
        later = _connect(server.port, 6) + _connect(server.port, 2)
        held = _wait_held([busy], server.port, held[busy] + 8)
        assert held[busy] >= 8
    finally:
        os.kill(stopped, signal.SIGCONT)
    for sock in first + later:
        sock.close()
