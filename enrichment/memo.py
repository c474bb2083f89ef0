"""A bounded memo for pure look-ups that repeat (user agents, URLs, referrers)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any


class Memo(dict):
    """memo[key] is fn(key), computed once; a hit costs one dictionary look-up.

    When it holds max_entries it starts over: cheap, and bounded whatever callers send.
    """

    def __init__(self, fn: Callable[[Any], Any], max_entries: int = 10_000):
        super().__init__()
        self.fn = fn
        self.max_entries = max_entries

    def __missing__(self, key: Hashable) -> Any:
        value = self.fn(key)
        if len(self) >= self.max_entries:
            self.clear()
        self[key] = value
        return value
