"""`app:app` behind a test middleware, served by a real gunicorn for the client tests.

TEST_FAULTS="/api/v1/events=500x3,/api/v1/payments=503x1" answers the first 3 requests to
the events path with 500 and the first payment with 503 (per worker: use one worker), in
Tally's envelope, before the app sees them. TEST_REQUEST_LOG names a file that gets one
line "METHOD PATH STATUS" per request, so a test can count what the server received.
"""

from __future__ import annotations

import os
import threading

import orjson

from app import app as tally

FAULT_BODIES = {
    500: (b"500 Internal Server Error", "server_error", "injected fault"),
    503: (b"503 Service Unavailable", "rate_limited", "injected fault"),
}


def _faults(spec: str) -> dict[str, list[int]]:
    faults: dict[str, list[int]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        path, rule = item.split("=")
        status, count = rule.split("x")
        faults.setdefault(path, []).extend([int(status)] * int(count))
    return faults


class FaultyTally:
    def __init__(self, wrapped):
        self.wrapped = wrapped
        self.faults = _faults(os.environ.get("TEST_FAULTS", ""))
        self.request_log = os.environ.get("TEST_REQUEST_LOG")
        self.lock = threading.Lock()

    def __getattr__(self, name):  # start(), stop(), config: gunicorn.conf.py's hooks
        return getattr(self.wrapped, name)

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        with self.lock:
            queue = self.faults.get(path)
            fault = queue.pop(0) if queue else None
        if fault is None:
            seen = {}

            def recording_start(status, headers, exc_info=None):
                seen["status"] = status.split()[0]
                return start_response(status, headers, exc_info)

            result = self.wrapped(environ, recording_start)
            self._record(environ, path, seen.get("status", "?"))
            return result
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        status_line, code, message = FAULT_BODIES[fault]
        body = orjson.dumps({"ok": False, "error": {"code": code, "message": message}})
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        if fault == 503:
            headers.append(("Retry-After", "1"))
        start_response(status_line.decode(), headers)
        self._record(environ, path, str(fault))
        return [body]

    def _record(self, environ, path: str, status: str) -> None:
        if self.request_log:
            with self.lock, open(self.request_log, "a") as log:
                log.write(f"{environ.get('REQUEST_METHOD')} {path} {status}\n")


app = FaultyTally(tally)
