"""gunicorn's threaded worker with a bound on how long one read from a client may wait.

gthread keeps a connection that has sent nothing, or that waits between keep-alive
requests, in the worker's poller rather than in a thread, so idle clients cost a file
descriptor each. Once a request starts arriving a thread reads it, blocking; without a
timeout a client that stops sending mid-request would hold that thread for good. Here
each read waits at most READ_TIMEOUT seconds, then the connection is closed (a body cut
short is 400 `invalid_input`, api/bodies.py).

Per request, gthread's loop also made system calls that change nothing between requests:
it switched a keep-alive socket to blocking and back (then this worker set the timeout
again), and it touched the heartbeat file and asked for its parent's pid on every pass.
Each releases and takes back the GIL, which the flush thread and the other request
threads want, so here a socket keeps its timeout (its descriptor stays non-blocking,
which is all the poller needs) and the heartbeat and parent checks run at most every
HEARTBEAT_EVERY seconds (the arbiter's timeout is 30 s).

Workers share one listening socket, and a keep-alive connection stays with the worker that
accepted it. Both workers' pollers wake for a new connection and the first to call
accept() wins, so a burst of connections (a client's pool, a proxy's upstream keep-alive)
could all land on one worker, whose queue then fills while the other idles (one worker held
16 of wrk's 16 connections in the bench). So the workers publish how many connections each
holds in a mapping the master makes before it forks them, and a worker holding more than
its share of all of them stops watching the listener for ACCEPT_PAUSE seconds, long enough
for an idle worker to take the connection; if none does, it takes it itself, and accepts
without pausing for GREEDY_AFTER_PAUSE seconds.
"""

from __future__ import annotations

import mmap
import os
import selectors
import threading
import time
from concurrent import futures
from functools import partial

from gunicorn.workers.gthread import ThreadWorker

READ_TIMEOUT = 10.0
HEARTBEAT_EVERY = 0.5
# The OS name of the threads that serve requests (top -H, /proc/PID/task/TID/comm): the
# bench tells their CPU from the flush thread's by it (bench/measure.py).
REQUEST_THREAD_NAME = "tally-request"
ACCEPT_PAUSE = 0.05
# When a pause ends with no other worker having taken the connection (the others busy or
# gone), this worker accepts without pausing for this long.
GREEDY_AFTER_PAUSE = 1.0
# A slot of connections held for each worker, by its age (gunicorn numbers the workers it
# forks); two live workers share a slot only BALANCE_SLOTS forks apart, and a killed
# worker's stale count only makes the others pause less.
BALANCE_SLOTS = 256
_SHARED = mmap.mmap(-1, 4 * BALANCE_SLOTS)  # anonymous and shared: the workers inherit it
HELD = memoryview(_SHARED).cast("i")


def name_os_thread(name: str) -> None:
    """Give the calling thread `name` (at most 15 bytes) in the OS's thread listings."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(name[:15])
    except OSError:
        pass  # not Linux, or /proc not mounted: names are only for people and the bench


class TallyThreadWorker(ThreadWorker):
    def run(self):
        # gunicorn points signal.set_wakeup_fd at self.PIPE; with that pipe in the poller a
        # SIGTERM or SIGQUIT ends the loop at once instead of after its 1 s select, so a
        # stop (a deploy, a restart) is that much shorter.
        self.poller.register(self.PIPE[0], selectors.EVENT_READ, self._woken)
        self._serve()

    def _serve(self):
        """gthread's loop, less its `futures.wait(self.futures, timeout=0)` on every pass
        (9-21 us of Python a pass with 1-16 requests in flight, a pass or more a request):
        finish_request drops each finished future from self.futures instead."""
        self._slot = self.age % BALANCE_SLOTS
        self._listeners = []
        for sock in self.sockets:
            sock.setblocking(False)
            server = sock.getsockname()
            self._listeners.append((sock, partial(self.accept, server)))
            self.poller.register(sock, selectors.EVENT_READ, self._listeners[-1][1])
        self._resume_at = None
        self._greedy_until = 0.0
        while self.alive:
            self.notify()
            HELD[self._slot] = self.nr_conns
            if self._resume_at is not None:
                now = time.monotonic()
                if now >= self._resume_at:
                    self._listen()
                    held = self.nr_conns
                    for sock, accept in self._listeners:
                        ThreadWorker.accept(self, accept.args[0], sock)
                    if self.nr_conns > held:
                        # No other worker took what was waiting (they are busy or gone):
                        # this one takes what comes for a while.
                        self._greedy_until = now + GREEDY_AFTER_PAUSE
                elif not self._over_share():
                    self._listen()
            if self.nr_conns < self.worker_connections:
                wait = 1.0 if self._resume_at is None else ACCEPT_PAUSE
                for key, _ in self.poller.select(wait):
                    key.data(key.fileobj)
            else:
                futures.wait(self.futures, timeout=1.0, return_when=futures.FIRST_COMPLETED)
            if not self.is_parent_alive():
                break
            self.murder_keepalived()
        HELD[self._slot] = 0
        self.tpool.shutdown(False)
        self.poller.close()
        for sock in self.sockets:
            sock.close()
        futures.wait(self.futures, timeout=self.cfg.graceful_timeout)

    def _over_share(self) -> bool:
        """Whether this worker holds more than its share of all workers' connections."""
        workers = self.cfg.workers
        if workers < 2 or self.nr_conns < 1:
            return False
        HELD[self._slot] = self.nr_conns
        return self.nr_conns > -(-sum(HELD) // workers)

    def accept(self, server, listener):
        if (self._resume_at is None and self._over_share()
                and time.monotonic() >= self._greedy_until):
            # Another worker may take this connection: stop watching the listeners.
            self._resume_at = time.monotonic() + ACCEPT_PAUSE
            for sock, _ in self._listeners:
                self.poller.unregister(sock)
            return
        super().accept(server, listener)
        HELD[self._slot] = self.nr_conns

    def _listen(self):
        self._resume_at = None
        for sock, accept in self._listeners:
            self.poller.register(sock, selectors.EVENT_READ, accept)

    def _woken(self, fd):
        try:
            while os.read(fd, 4096):
                pass
        except BlockingIOError:
            pass

    def get_thread_pool(self):
        return futures.ThreadPoolExecutor(max_workers=self.cfg.threads,
                                          initializer=name_os_thread,
                                          initargs=(REQUEST_THREAD_NAME,))

    def enqueue_req(self, conn):
        # A keep-alive connection's socket still has READ_TIMEOUT from its first request
        # (finish_request leaves it): nothing to set again.
        if conn.sock.gettimeout() != READ_TIMEOUT:
            conn.init()
            conn.sock.settimeout(READ_TIMEOUT)
        future = self.tpool.submit(self.handle, conn)
        self._wrap_future(future, conn)

    def finish_request(self, fs):
        """gthread's, less `setblocking(False)`: a socket with a timeout is already
        non-blocking underneath, and the poller only watches its descriptor; and the
        future leaves self.futures here, not in the loop."""
        try:
            self.futures.remove(fs)
        except ValueError:
            pass
        if fs.cancelled():
            self.nr_conns -= 1
            fs.conn.close()
            return
        try:
            keepalive, conn = fs.result()
            if keepalive and self.alive:
                conn.set_timeout()
                with self._lock:
                    self._keep.append(conn)
                    self.poller.register(conn.sock, selectors.EVENT_READ,
                                         partial(self.on_client_socket_readable, conn))
            else:
                self.nr_conns -= 1
                conn.close()
        except Exception:
            self.nr_conns -= 1
            fs.conn.close()

    _next_heartbeat = 0.0
    _next_parent_check = 0.0

    def notify(self):
        now = time.monotonic()
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + HEARTBEAT_EVERY
            super().notify()

    def is_parent_alive(self):
        now = time.monotonic()
        if now < self._next_parent_check:
            return True
        self._next_parent_check = now + HEARTBEAT_EVERY
        return super().is_parent_alive()
