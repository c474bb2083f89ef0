"""`app:app` with one more path, for a real gunicorn (`app="tests.modules_app:app"`):
GET /test/modules answers the names of the modules imported by the worker that serves
it, one a line. Every other request goes to Tally as it is."""

from __future__ import annotations

import sys

from app import app as tally


class ModulesTally:
    def __init__(self, wrapped):
        self.wrapped = wrapped

    def __getattr__(self, name):  # start(), stop(), config: gunicorn.conf.py's hooks
        return getattr(self.wrapped, name)

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") != "/test/modules":
            return self.wrapped(environ, start_response)
        body = "\n".join(sorted(sys.modules)).encode()
        start_response("200 OK", [("Content-Type", "text/plain"),
                                  ("Content-Length", str(len(body)))])
        return [body]


app = ModulesTally(tally)
