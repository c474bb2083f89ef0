"""A small time-bounded cache, so a change in the database reaches every worker quickly."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any


class _Load:
    """One load of a key in progress; the threads that want the same key wait for it."""

    __slots__ = ("done", "value", "loaded")

    def __init__(self):
        self.done = threading.Event()
        self.value: Any = None
        self.loaded = False


class TTLCache:
    """Remembers load(key) for ttl seconds of the injected clock; bounded in size.

    A key is loaded by one thread at a time: the others that miss it meanwhile wait for
    that load's answer (or load it themselves if it failed). When an entry expires under
    a worker's sixteen busy threads they would otherwise all read it at once, each with a
    database connection of its own, which the worker then keeps (docs/perf-notes.md,
    "Worker memory, fifth round").
    """

    def __init__(self, load: Callable[[Any], Any], clock: Callable[[], float], ttl: float = 1.0,
                 max_entries: int = 10_000):
        self._load = load
        self._clock = clock
        self._ttl = ttl
        self._max = max_entries
        self._entries: dict[Hashable, tuple[float, Any]] = {}
        self._loading: dict[Hashable, _Load] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        now = self._clock()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        with self._lock:
            load = self._loading.get(key)
            leader = load is None
            if leader:
                load = self._loading[key] = _Load()
        if not leader:
            load.done.wait()
            if load.loaded:
                return load.value
            return self._load(key)  # the load waited for failed: this caller's own try
        try:
            value = self._load(key)
            if len(self._entries) >= self._max:
                self._entries.clear()
            self._entries[key] = (now + self._ttl, value)
            load.value, load.loaded = value, True
        finally:
            with self._lock:
                del self._loading[key]
            load.done.set()
        return value

    def clear(self) -> None:
        self._entries.clear()
