"""Peak memory of one worker kept saturated with 50-event batches, in-process (no HTTP
server, no wrk), so that the machine's load moves the figure little.

    .venv/bin/python -m bench.worker_memory [--requests 3000] [--threads 16]
                                            [--backend sqlite|postgres] [--part-events N]

One process is one worker: `create_app` on a new SQLite file (or a new PostgreSQL
database on --postgres-url), gunicorn.conf.py's post_fork
hook (the malloc arenas), `Tally.start()` (the flush thread warms the parsers up), then
gc.freeze() as post_worker_init does. VmHWM is reset (/proc/self/clear_refs) and THREADS
threads post `make bench`'s batch bodies through falcon.testing until REQUESTS were
accepted: the flush thread cannot keep up, so the queue stays near TALLY_QUEUE_MAX and
the batches it cannot take are answered 503 (that thread then waits 5 ms), as a worker
past its highest sustained rate does. Printed:
VmRSS before, VmHWM during, VmRSS after the last flush, the answers, the events stored,
the most events the queue held and the largest flush part (the peak follows both),
and this process's CPU per stored event (request threads and the flush thread; the 503s
cost a little of it).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import runpy
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import falcon.testing
import orjson

from app import create_app
from bench.bodies import SITE_HOSTS, batch_bodies
from bench.measure import REPO, loadavg, postgres_database
from bench.run import POSTGRES_URL
from config import Config

RETRY_AFTER_503 = 0.005


def status_mib() -> dict:
    figures = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            figures[key] = round(int(value.split()[0]) / 1024, 1)
    return figures


def run(folder: Path, requests: int, threads: int, database_url: str | None = None,
        part_events: int | None = None) -> dict:
    tally = create_app(Config(db_path=str(folder / "tally.db"), database_url=database_url))
    if part_events is not None:
        tally.flusher.part_events = part_events
    runpy.run_path(str(REPO / "gunicorn.conf.py"))["post_fork"](None, None)
    account = tally.directory.create_account("Bench", "scale")
    site = tally.directory.create_site(account["id"], list(SITE_HOSTS))
    key = tally.directory.create_key(site["id"], ["events"])["key"]
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    bodies = batch_bodies(site["id"])
    client = falcon.testing.TestClient(tally)
    tally.start()
    assert client.simulate_post("/api/v1/events", body=bodies[0], headers=headers).status_code == 204
    if not tally.flusher.flush_now(timeout=60):
        raise SystemExit("the first batch was not stored in 60 s")
    gc.collect()
    gc.freeze()
    before = status_mib()
    Path("/proc/self/clear_refs").write_text("5")
    answers: Counter[int] = Counter()
    lock = threading.Lock()
    most_held = [0]
    part_sizes: list[int] = []
    store = tally.flusher._store

    def store_counted(units):
        part_sizes.append(sum(len(unit.events) for unit in units))
        store(units)

    tally.flusher._store = store_counted

    def post(n: int) -> None:
        while True:
            with lock:
                if answers[204] >= requests:
                    return
            status = client.simulate_post("/api/v1/events", body=bodies[n % len(bodies)],
                                          headers=headers).status_code
            held = tally.flusher.queue.held
            with lock:
                answers[status] += 1
                most_held[0] = max(most_held[0], held)
            if status == 503:
                time.sleep(RETRY_AFTER_503)  # a client's pause, not a busy loop on the GIL
            n += threads

    cpu = time.process_time()
    started = time.perf_counter()
    workers = [threading.Thread(target=post, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if not tally.flusher.flush_now(timeout=120):
        raise SystemExit("the accepted events were not stored in 120 s")
    cpu = time.process_time() - cpu
    seconds = time.perf_counter() - started
    during = status_mib()["VmHWM"]
    stored = tally.flusher.stored_events - 50
    tally.stop(timeout=10)
    return {"rss_before_mib": before["VmRSS"], "peak_mib": during,
            "rss_after_mib": status_mib()["VmRSS"], "answers": {str(k): v for k, v in sorted(answers.items())},
            "events_stored": stored, "seconds": round(seconds, 2),
            "queue_most_held": most_held[0], "largest_part": max(part_sizes, default=0),
            "parts": len(part_sizes),
            "cpu_us_per_stored_event": round(cpu * 1e6 / stored, 1) if stored else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000,
                        help="batches to have accepted (each 50 events)")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--postgres-url", default=POSTGRES_URL)
    parser.add_argument("--part-events", type=int, default=None,
                        help="events a flush transaction stores at most (default: the flush's own)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tally-worker-memory-")))
        url = (stack.enter_context(postgres_database(args.postgres_url, "tally_worker_memory"))
               if args.backend == "postgres" else None)
        result = run(folder, args.requests, args.threads, url, args.part_events)
    print(orjson.dumps({"load": loadavg(), "backend": args.backend, **result}).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
