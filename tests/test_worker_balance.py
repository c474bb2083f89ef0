"""gunicorn's workers share one listening socket and a keep-alive connection stays with the
worker that accepted it: serving/worker.py has a worker holding more than its share of all
workers' connections leave a new one to another worker, and take it itself when no other
does (a worker stopped or busy)."""

from __future__ import annotations

import os
import signal
import socket

import pytest

from tests.conftest import WAIT, read_head, wait_until

pytestmark = pytest.mark.slow

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: tally\r\nConnection: keep-alive\r\n\r\n"


def _workers(master: int) -> list[int]:
    with open(f"/proc/{master}/task/{master}/children") as children:
        return [int(pid) for pid in children.read().split()]


def _sockets(port: int, state: str) -> set[str]:
    """The inodes of the TCP sockets of local `port` in `state` (01 established, 0A listen)."""
    with open("/proc/net/tcp") as table:
        return {fields[9] for fields in (line.split() for line in table.readlines()[1:])
                if int(fields[1].split(":")[1], 16) == port and fields[3] == state}


def _socket_fds(pid: int) -> dict[str, str]:
    """A process's sockets: inode -> its descriptor's number."""
    folder = f"/proc/{pid}/fd"
    found = {}
    for fd in os.listdir(folder):
        try:
            target = os.readlink(f"{folder}/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            found[target[8:-1]] = fd
    return found


def _connections_held(pids: list[int], port: int) -> dict[int, int]:
    """How many established connections to `port` each process holds."""
    established = _sockets(port, "01")
    return {pid: len(established & _socket_fds(pid).keys()) for pid in pids}


def _watches_listener(pid: int, port: int) -> bool:
    """Whether a worker's poller (an epoll descriptor) watches the listening socket: its
    loop has started and it accepts."""
    fds = _socket_fds(pid)
    listening = [fds[inode] for inode in _sockets(port, "0A") if inode in fds]
    folder = f"/proc/{pid}/fdinfo"
    for fd in os.listdir(folder):
        try:
            with open(f"{folder}/{fd}") as info:
                watched = {line.split()[1] for line in info if line.startswith("tfd:")}
        except OSError:
            continue
        if watched.intersection(listening):
            return True
    return False


def _accepting_workers(server) -> list[int]:
    """The server's two workers, once both have started their loops (the master answers
    /healthz through the first one up)."""
    assert wait_until(lambda: len(_workers(server.proc.pid)) == 2
                      and all(_watches_listener(pid, server.port)
                              for pid in _workers(server.proc.pid)))
    return _workers(server.proc.pid)


def _connect(port: int, count: int) -> list[socket.socket]:
    """`count` connections opened at once, then a request on each, each answered."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=WAIT) for _ in range(count)]
    for sock in socks:
        sock.sendall(REQUEST)
    for sock in socks:
        assert read_head(sock).startswith(b"HTTP/1.1 200")
    return socks


def _wait_held(pids: list[int], port: int, total: int) -> dict[int, int]:
    wait_until(lambda: sum(_connections_held(pids, port).values()) >= total)
    return _connections_held(pids, port)


def test_a_burst_of_keep_alive_connections_is_shared_by_both_workers(server_factory, tmp_path):
    server = server_factory(str(tmp_path / "tally.db"), workers=2)
    pids = _accepting_workers(server)
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
    pids = _accepting_workers(server)
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
