"""A bounded in-process queue of accepted requests, counted in events.

A request's accepted events go in as one unit or not at all. The bound covers every
event the worker holds in memory: those waiting and those the flush thread has taken
but not yet stored, so a stuck database fills the queue and callers get 503.
"""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

from validation.event import CleanEvent


class Accepted(NamedTuple):
    """The events one request had accepted, with what the flush needs to store them."""

    site_id: int
    account_id: int
    month: str  # quota month of the receipt, "YYYY-MM" (UTC)
    day: int  # UTC day of the receipt: whose visitor salt applies
    events: list[CleanEvent]
    counted: int  # events that count toward the monthly quota
    # The tally_vid id the browser sent (POST /api/v1/collect), None from the events API.
    browser_id: str | None = None
    anonymous: bool = False  # from POST /api/v1/collect: no key vouches for it
    # Whether a `$identify` of the unit may link its uid to the visitor: a keyed one, or
    # an anonymous one whose identity hash the site's secret verified.
    links_identity: bool = True


class EventQueue:
    def __init__(self, max_events: int, flush_at: int | None = None):
        self.max_events = max_events
        # Wake the flush thread early once a quarter of the queue waits: a busy worker
        # then writes transactions of thousands of rows (cheap per row) and keeps three
        # quarters of the queue free for what arrives while a flush runs.
        self.flush_at = flush_at or max(1, max_events // 4)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._units: list[Accepted] = []
        self._waiting = 0  # events in _units
        self._held = 0  # events in _units plus those taken and not yet stored
        self._wake = False
        self._closed = False

    def offer(self, unit: Accepted) -> bool:
        """Take all of the unit's events, or none when they do not fit (or after close)."""
        size = len(unit.events)
        with self._lock:
            if self._closed or self._held + size > self.max_events:
                return False
            self._units.append(unit)
            self._waiting += size
            self._held += size
            if self._waiting >= self.flush_at and not self._wake:
                self._wake = True
                self._cond.notify()
            return True

    def take(self) -> list[Accepted]:
        """Everything waiting; the caller must call stored() once it is in the database."""
        with self._cond:
            units, self._units = self._units, []
            self._waiting = 0
            self._wake = False
            return units

    def stored(self, units: list[Accepted]) -> None:
        with self._cond:
            self._held -= sum(len(unit.events) for unit in units)

    def wait(self, timeout: float) -> None:
        """Until woken (enough events, wake(), close()) or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._wake and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)

    def wake(self) -> None:
        with self._cond:
            self._wake = True
            self._cond.notify()

    def close(self) -> None:
        """Refuse every later offer and wake the flush thread for its last flush."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def room(self) -> int:
        """Events an offer could still add (0 once closed)."""
        return 0 if self._closed else self.max_events - self._held

    @property
    def held(self) -> int:
        return self._held

    @property
    def waiting(self) -> int:
        return self._waiting
