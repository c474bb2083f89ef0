"""glibc's malloc in a worker: at most MALLOC_ARENAS arenas.

glibc gives each new thread that allocates its own arena (up to 8 per core), and an
arena keeps the memory freed into it. A worker's sixteen request threads each build
bodies and events, so under load each holds its own high-water mark; sharing two arenas
cut the batch bench's peak worker RSS (docs/perf-notes.md). Python's small objects do not
use malloc's arenas (pymalloc maps its own), so the threads contend only for larger
blocks.
"""

from __future__ import annotations

import ctypes

MALLOC_ARENAS = 2
M_ARENA_MAX = -8  # glibc's malloc.h


def _libc():
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def limit_arenas(count: int = MALLOC_ARENAS) -> bool:
    """Cap the arenas malloc makes for this process's threads from now on; False where
    the C library is not glibc (no mallopt, or it refused)."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return mallopt(M_ARENA_MAX, count) == 1
