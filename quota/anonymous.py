"""What anonymous traffic (POST /api/v1/collect) may use, per worker and in memory:
requests per client address, and `$identify` events per visitor and UTC day.

Both are bounded maps: the least recently used entry goes when one is full. Losing an
entry only ever gives its client a fresh allowance, never takes one away, and a bucket
idle long enough to be evicted under load is a full one anyway.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable


class AddressRate:
    """A token bucket per client address block: `rate` requests a second, `burst` at once.

    `take(block)` answers 0 when the request may go on, else the whole seconds until it
    could. A rate of 0 turns the limit off."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float],
                 max_entries: int = 10_000):
        self.rate = rate
        self.burst = max(1, burst)
        self.clock = clock
        self._max = max(1, max_entries)
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at
        self._lock = threading.Lock()

    def take(self, block: str) -> int:
        if self.rate <= 0:
            return 0
        now = self.clock()
        with self._lock:
            buckets = self._buckets
            entry = buckets.pop(block, None)
            if entry is None:
                tokens = float(self.burst)
                if len(buckets) >= self._max:
                    buckets.popitem(last=False)
            else:
                tokens, at = entry
                tokens = min(float(self.burst), tokens + max(0.0, now - at) * self.rate)
            if tokens >= 1.0:
                buckets[block] = (tokens - 1.0, now)
                return 0
            buckets[block] = (tokens, now)
            return max(1, math.ceil((1.0 - tokens) / self.rate))


class IdentifyBudget:
    """`$identify` from the browser: each user id once per visitor and UTC day, and at most
    `per_visitor` user ids per visitor and day. A verified identify of a user id seen
    unverified still passes once: it is the one that may link the user."""

    def __init__(self, per_visitor: int, max_entries: int = 10_000):
        self.per_visitor = per_visitor
        self._max = max(1, max_entries)
        # (visitor key, day) -> {uid: verified}
        self._seen: OrderedDict[tuple[bytes, int], dict[str, bool]] = OrderedDict()
        self._lock = threading.Lock()

    def claim(self, visitor: bytes, day: int, uid: str,
              verified: bool) -> Callable[[], None] | None:
        """None when this identify is to be dropped; else it is recorded, and the function
        returned forgets it again (for an identify refused after all)."""
        key = (visitor, day)
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                if len(self._seen) >= self._max:
                    self._seen.popitem(last=False)
                seen = self._seen[key] = {}
            else:
                self._seen.move_to_end(key)
            before = seen.get(uid)
            if before is None:
                if len(seen) >= self.per_visitor:
                    return None
            elif before or not verified:
                return None
            seen[uid] = verified

        def undo() -> None:
            with self._lock:
                if seen.get(uid) is verified:
                    if before is None:
                        del seen[uid]
                    else:
                        seen[uid] = before
        return undo
