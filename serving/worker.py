"""gunicorn's threaded worker with a bound on how long one read from a client may wait.

gthread keeps a connection that has sent nothing, or that waits between keep-alive
requests, in the worker's poller rather than in a thread, so idle clients cost a file
descriptor each. Once a request starts arriving a thread reads it, blocking; without a
timeout a client that stops sending mid-request would hold that thread for good. Here
each read waits at most READ_TIMEOUT seconds, then the connection is closed (a body cut
short is 400 `invalid_input`, api/bodies.py).
"""

from __future__ import annotations

from gunicorn.workers.gthread import ThreadWorker

READ_TIMEOUT = 10.0


class TallyThreadWorker(ThreadWorker):
    def enqueue_req(self, conn):
        conn.init()
        conn.sock.settimeout(READ_TIMEOUT)
        future = self.tpool.submit(self.handle, conn)
        self._wrap_future(future, conn)
