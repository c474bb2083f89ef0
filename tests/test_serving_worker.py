"""serving/worker.py's loop wakes on gunicorn's signal pipe: a SIGTERM to an idle worker
ends its loop at once, not after the poller's 1 s timeout (every stop and deploy waited it)."""

from __future__ import annotations

import collections
import os
import selectors
import signal
import socket
import threading
from concurrent import futures

from gunicorn import util

from serving.worker import READ_TIMEOUT, TallyThreadWorker
from tests.conftest import WAIT


def test_a_signal_wakes_the_idle_loop_through_gunicorns_pipe(monkeypatch):
    worker = TallyThreadWorker.__new__(TallyThreadWorker)
    worker.poller = selectors.DefaultSelector()
    worker.PIPE = os.pipe()
    for fd in worker.PIPE:
        util.set_non_blocking(fd)
    woken = []

    def one_turn_of_the_loop(self):
        # the worker's loop (gthread's, serving/worker.py), reduced to one wait of its
        # poller (a deadline, not a speed check)
        for key, _ in self.poller.select(WAIT):
            key.data(key.fileobj)
            woken.append(key.fileobj)

    monkeypatch.setattr(TallyThreadWorker, "_serve", one_turn_of_the_loop)
    previous = signal.set_wakeup_fd(worker.PIPE[1])  # what gunicorn's init_signals does
    received = []
    old_handler = signal.signal(signal.SIGUSR1, lambda *_: received.append(True))
    try:
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        worker.run()
    finally:
        signal.set_wakeup_fd(previous)
        signal.signal(signal.SIGUSR1, old_handler)
        worker.poller.close()
    assert woken == [worker.PIPE[0]]
    assert received == [True]
    try:  # drained, so the next turn waits again
        assert os.read(worker.PIPE[0], 1) == b""
    except BlockingIOError:
        pass
    for fd in worker.PIPE:
        os.close(fd)


class _Conn:
    def __init__(self, sock):
        self.sock = sock
        self.closed = False
        self.timeout = None

    def set_timeout(self):
        self.timeout = 1.0

    def close(self):
        self.closed = True
        self.sock.close()


def _finishing_worker():
    worker = TallyThreadWorker.__new__(TallyThreadWorker)
    worker.poller = selectors.DefaultSelector()
    worker._lock = threading.RLock()
    worker._keep = collections.deque()
    worker.futures = collections.deque()
    worker.alive = True
    worker.nr_conns = 2
    return worker


def test_a_finished_request_leaves_the_futures_and_a_kept_socket_keeps_its_timeout():
    """finish_request takes the future out of the loop's list (the loop no longer scans
    it every pass), and a keep-alive socket goes back to the poller with READ_TIMEOUT
    still set, so its next request reads under the same bound without setting it again."""
    worker = _finishing_worker()
    kept_sock, peer = socket.socketpair()
    closed_sock, peer2 = socket.socketpair()
    try:
        kept_sock.settimeout(READ_TIMEOUT)
        kept, closing = _Conn(kept_sock), _Conn(closed_sock)
        done = []
        for conn, keepalive in ((kept, True), (closing, False)):
            future = futures.Future()
            future.conn = conn
            future.set_result((keepalive, conn))
            worker.futures.append(future)
            done.append(future)
        for future in done:
            worker.finish_request(future)
        assert not worker.futures
        assert kept_sock.gettimeout() == READ_TIMEOUT
        assert list(worker._keep) == [kept] and not kept.closed
        assert worker.poller.get_key(kept_sock).fileobj is kept_sock
        assert closing.closed and worker.nr_conns == 1
    finally:
        worker.poller.close()
        for sock in (kept_sock, peer, closed_sock, peer2):
            sock.close()
