"""A route's resource built on its first request, with the modules it needs.

Importing the dashboard's module or the Stripe webhook's costs a worker ~1-1.5 MiB each
(docs/perf-notes.md), and a worker that only ingests never serves them. The routes are
added to Falcon at once, each to a DeferredResource that names the responders the real
resource has (Falcon looks them up when the route is added); the first request builds
the resource and every request is passed on to it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable


class DeferredResource:
    def __init__(self, build: Callable[[], object], responders: Iterable[str]):
        self._build = build
        self._built: object | None = None
        self._lock = threading.Lock()
        for name in responders:
            setattr(self, name, self._passing_on(name))

    @property
    def built(self) -> bool:
        return self._built is not None

    @property
    def resource(self):
        """The real resource, built (its modules imported) on the first call."""
        built = self._built
        if built is None:
            with self._lock:
                if self._built is None:
                    self._built = self._build()
                built = self._built
        return built

    def _passing_on(self, name: str) -> Callable:
        def responder(req, resp, **params):
            return getattr(self.resource, name)(req, resp, **params)

        responder.__name__ = name
        return responder
