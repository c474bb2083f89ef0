"""A bounded memo for pure look-ups that repeat (user agents, URLs, referrers)."""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import Any


class Memo(dict):
    """memo[key] is fn(key), computed once; a hit costs one dictionary look-up.

    Bounded whatever callers send: when it holds max_entries it starts over, and a key
    longer than max_key_length (callers choose the strings) is computed but not kept.
    """

    def __init__(self, fn: Callable[[Any], Any], max_entries: int = 10_000,
                 max_key_length: int = 1_024):
        super().__init__()
        self.fn = fn
        self.max_entries = max_entries
        self.max_key_length = max_key_length

    def __missing__(self, key: Sized) -> Any:
        return self.add(key)

    def add(self, key: Sized, *args: Any) -> Any:
        """fn(key, *args), kept under `key` within the bounds; for a miss whose function
        needs more than the key (each of `args` follows from the key, so a hit is still a
        look-up of the key alone)."""
        value = self.fn(key, *args)
        if len(key) <= self.max_key_length:
            if len(self) >= self.max_entries:
                self.clear()
            self[key] = value
        return value
