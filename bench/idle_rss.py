"""Idle memory of Tally's gunicorn workers: start the repo's gunicorn.conf.py on a new
SQLite database, post some single events (the parsers warm up, a flush runs), wait until
they are stored, then read VmRSS, VmHWM and the count of glibc malloc arenas of the
master and of each worker.

    .venv/bin/python -m bench.idle_rss [--workers 2] [--events 40]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import orjson

from bench.bodies import single_event_bodies
from bench.measure import Load, children, http, loadavg, table_count
from bench.run import Bench


def status_mib(pid: int) -> dict:
    figures = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            figures[key] = round(int(value.split()[0]) / 1024, 1)
    return figures


def arenas(pid: int) -> int:
    """glibc reserves each malloc arena other than the main one as a 64 MiB-aligned heap
    of 64 MiB (mapped partly read-write, the rest PROT_NONE): count those reservations."""
    starts: dict[int, int] = {}
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) > 5:
            continue  # a file or a named region ([heap], [stack])
        low, high = (int(x, 16) for x in parts[0].split("-"))
        base = low & ~(64 * 2**20 - 1)
        starts[base] = starts.get(base, 0) + (high - low)
    return 1 + sum(1 for size in starts.values() if size == 64 * 2**20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--events", type=int, default=40)
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds idle after the events are stored")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tally-idle-") as folder:
        bench = Bench(workers=args.workers, load=Load(),
                      folder=Path(folder))
        tally = bench.start_tally()
        try:
            bodies = single_event_bodies(bench.site, count=args.events)
            for body in bodies:
                status, answer = http("POST", tally.url + "/api/v1/events", body, bench.auth())
                if status != 204:
                    raise SystemExit(f"POST answered {status}: {answer[:200]!r}")
            deadline = time.monotonic() + 30
            while table_count(bench.database, "events") < len(bodies):
                if time.monotonic() > deadline:
                    raise SystemExit("events not stored after 30 s")
                time.sleep(0.1)
            time.sleep(args.settle)
            workers = children(tally.proc.pid)
            print(orjson.dumps({
                "load": loadavg(),
                "master": status_mib(tally.proc.pid),
                "workers": [status_mib(pid) | {"arenas": arenas(pid)} for pid in workers],
            }).decode())
        finally:
            bench.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
