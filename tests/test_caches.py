"""api.caches.TTLCache: one load of a key at a time, whatever the threads asking."""

from __future__ import annotations

import threading

from api.caches import TTLCache
from tests.conftest import WAIT, wait_until


class BlockingLoad:
    """A load whose first call waits for release(); later calls answer at once."""

    def __init__(self, first_fails: bool = False):
        self.calls = 0
        self.first_fails = first_fails
        self.started = threading.Event()
        self.released = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, key):
        with self.lock:
            self.calls += 1
            call = self.calls
        if call == 1:
            self.started.set()
            assert self.released.wait(WAIT)
            if self.first_fails:
                raise RuntimeError("the database went away")
        return f"{key}-{call}"


class CountingClock:
    """The injected clock, standing still; counts the get() calls that have begun."""

    def __init__(self):
        self.reads = 0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            self.reads += 1
        return 1_000.0


def ask_concurrently(cache: TTLCache, load: BlockingLoad, clock: CountingClock,
                     askers: int) -> tuple[list, list]:
    answers, errors = [], []

    def ask():
        try:
            answers.append(cache.get("k"))
        except RuntimeError as exc:
            errors.append(exc)

    first = threading.Thread(target=ask)
    first.start()
    assert load.started.wait(WAIT)
    others = [threading.Thread(target=ask) for _ in range(askers)]
    for thread in others:
        thread.start()
    assert wait_until(lambda: clock.reads == 1 + askers)
    load.released.set()
    for thread in [first, *others]:
        thread.join(WAIT)
    return answers, errors


def test_threads_that_miss_a_key_being_loaded_wait_for_that_load():
    load, clock = BlockingLoad(), CountingClock()
    cache = TTLCache(load, clock)
    answers, errors = ask_concurrently(cache, load, clock, askers=8)
    assert errors == []
    assert answers == ["k-1"] * 9
    assert load.calls == 1
    assert cache.get("k") == "k-1"  # kept for the ttl


def test_when_the_load_waited_for_fails_each_waiter_loads_for_itself():
    load, clock = BlockingLoad(first_fails=True), CountingClock()
    cache = TTLCache(load, clock)
    answers, errors = ask_concurrently(cache, load, clock, askers=3)
    assert len(errors) == 1  # the failed load's own caller sees its error
    assert len(answers) == 3 and all(answer.startswith("k-") for answer in answers)
    assert "k-1" not in answers


def test_an_expired_entry_is_loaded_again():
    ttl = 1.0
    now = [0.0]
    calls = []
    cache = TTLCache(lambda key: calls.append(key) or len(calls), lambda: now[0], ttl=ttl)
    assert cache.get("k") == 1
    now[0] = ttl - 0.001
    assert cache.get("k") == 1
    now[0] = ttl
    assert cache.get("k") == 2
