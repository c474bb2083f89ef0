"""A small time-bounded cache, so a change in the database reaches every worker quickly."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any


class TTLCache:
    """Remembers load(key) for ttl seconds of the injected clock; bounded in size."""

    def __init__(self, load: Callable[[Any], Any], clock: Callable[[], float], ttl: float = 1.0,
                 max_entries: int = 10_000):
        self._load = load
        self._clock = clock
        self._ttl = ttl
        self._max = max_entries
        self._entries: dict[Hashable, tuple[float, Any]] = {}

    def get(self, key: Hashable) -> Any:
        now = self._clock()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        value = self._load(key)
        if len(self._entries) >= self._max:
            self._entries.clear()
        self._entries[key] = (now + self._ttl, value)
        return value

    def clear(self) -> None:
        self._entries.clear()
