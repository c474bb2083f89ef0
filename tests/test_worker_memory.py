"""A gunicorn worker caps glibc's malloc arenas (serving/memory.py): its request threads
share MALLOC_ARENAS arenas instead of one each. Counted by glibc's own malloc_stats in a
process whose threads allocate at the same time."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from serving.memory import MALLOC_ARENAS
from tests.conftest import REPO

THREADS = 8
# Each thread allocates blocks too big for pymalloc (malloc serves them from the thread's
# arena) and holds them until every thread has, so none can reuse another's arena.
SCRIPT = f"""
import ctypes, runpy, sys, threading
if sys.argv[1] == "worker":
    runpy.run_path("gunicorn.conf.py")["post_fork"](None, None)
barrier = threading.Barrier({THREADS})
def allocate():
    held = [bytes(2048 + i) for i in range(50)]
    barrier.wait()
threads = [threading.Thread(target=allocate) for _ in range({THREADS})]
for thread in threads: thread.start()
for thread in threads: thread.join()
ctypes.CDLL(None).malloc_stats()
"""


def arenas_used(mode: str) -> int:
    result = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=REPO,
                            capture_output=True, text=True, timeout=60, check=True)
    return sum(1 for line in result.stderr.splitlines() if line.startswith("Arena "))


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_stats"),
                    reason="glibc's mallopt only")
def test_a_worker_shares_a_few_malloc_arenas_between_its_threads():
    assert arenas_used("plain") > MALLOC_ARENAS
    assert 1 <= arenas_used("worker") <= MALLOC_ARENAS
