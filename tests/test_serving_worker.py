"""serving/worker.py's loop wakes on gunicorn's signal pipe: a SIGTERM to an idle worker
ends its loop at once, not after the poller's 1 s timeout (every stop and deploy waited it)."""

from __future__ import annotations

import os
import selectors
import signal
import threading

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

from serving.worker import TallyThreadWorker
from tests.conftest import WAIT


def test_a_signal_wakes_the_idle_loop_through_gunicorns_pipe(monkeypatch):
    worker = TallyThreadWorker.__new__(TallyThreadWorker)
    worker.poller = selectors.DefaultSelector()
    worker.PIPE = os.pipe()
    for fd in worker.PIPE:
        util.set_non_blocking(fd)
    woken = []

    def one_turn_of_the_loop(self):
        # gthread's loop, reduced to one wait of its poller (a deadline, not a speed check)
        for key, _ in self.poller.select(WAIT):
            key.data(key.fileobj)
            woken.append(key.fileobj)

    monkeypatch.setattr(ThreadWorker, "run", one_turn_of_the_loop)
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
