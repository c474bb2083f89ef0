"""The single-event ceiling: a bare Falcon app whose POST answers 204 without work.

It reads the body (any endpoint must, or the sync worker closes a socket with unread
data and the client sees a reset) and does nothing else. Served by bench/run.py under
the same gunicorn settings as Tally (bench/ceiling_gunicorn.conf.py).
"""

from __future__ import annotations

import falcon


class Accept:
    def on_post(self, req, resp):
        req.bounded_stream.read()
        resp.status = falcon.HTTP_204

    def on_get(self, req, resp):
        resp.status = falcon.HTTP_200
        resp.data = b"ok"


def create_app() -> falcon.App:
    app = falcon.App()
    accept = Accept()
    for path in ("/healthz", "/api/v1/events", "/api/v1/collect", "/api/v1/payments"):
        app.add_route(path, accept)
    return app


app = create_app()
