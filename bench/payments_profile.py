"""Where a payment's time goes: `make bench`'s payments scenario with timers in the writer.

    .venv/bin/python -m bench.payments_profile [--backend sqlite] [--duration 10] [--runs 1]

The service is the repo's gunicorn.conf.py with every hook, plus (bench/
payments_profile_gunicorn.conf.py) timers around each worker's payment writer: the wait
for the write lock (BEGIN IMMEDIATE, or PostgreSQL's transaction with its site locks),
each payment's statements, the rest of the group (the SAVEPOINTs and the COMMIT, SQLite's
WAL fsync among them), and the writer's CPU.
The writer's OS thread is named `tally-payments`, so the workers' CPU splits into the
request threads (HTTP, parsing, validation, the wait for the answer), the writer and the
rest; wrk's own CPU is read from its rusage. One JSON line per run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import tempfile
import threading
import time
from pathlib import Path

import orjson

from bench.bodies import payment_bodies
from bench.measure import CLK_TCK, REPO, Load, loadavg, run_wrk, table_count, write_bodies
from bench.run import Bench

CONF = REPO / "bench" / "payments_profile_gunicorn.conf.py"
WRITER_THREAD = "tally-payments"
_OUT = "BENCH_PAYMENTS_PROFILE_DIR"

# In the worker (instrument, dump) ---------------------------------------------------
_stats = {"groups": 0, "payments": 0, "lock_s": 0.0, "writes_s": 0.0, "writes_cpu_s": 0.0,
          "commit_s": 0.0, "group_s": 0.0, "group_cpu_s": 0.0, "sizes": {}}


def instrument() -> None:
    """Wrap the writer's steps with timers (wall and thread CPU); only in the profile."""
    import storage.db as db
    from serving.worker import name_os_thread
    from storage.payments import GroupCommit

    original_run = GroupCommit._run

    def run(self):
        name_os_thread(WRITER_THREAD)
        original_run(self)

    original_begin = db.begin_immediate
    original_group = db.grouped_transaction

    def begin_immediate(conn):
        started = time.perf_counter()
        original_begin(conn)
        if threading.current_thread().name == WRITER_THREAD:
            _stats["lock_s"] += time.perf_counter() - started

    def grouped_transaction(conn, items, write, *more, call=None):
        def timed_write(item):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                write(item)
            finally:
                _stats["writes_s"] += time.perf_counter() - wall
                _stats["writes_cpu_s"] += time.thread_time() - cpu

        started, cpu = time.perf_counter(), time.thread_time()
        lock_before = _stats["lock_s"]
        try:
            return (call or original_group)(conn, items, timed_write, *more)
        finally:
            spent = time.perf_counter() - started
            _stats["group_s"] += spent
            _stats["group_cpu_s"] += time.thread_time() - cpu
            _stats["groups"] += 1
            _stats["payments"] += len(items)
            size = str(len(items))
            _stats["sizes"][size] = _stats["sizes"].get(size, 0) + 1
            _stats["commit_s"] += spent - (_stats["lock_s"] - lock_before)  # writes taken off below

    GroupCommit._run = run
    db.begin_immediate = begin_immediate
    db.grouped_transaction = grouped_transaction
    try:
        from storage.postgres import PostgresDatabase
    except ImportError:  # no psycopg: SQLite only
        return
    original_pg_group = PostgresDatabase.grouped_transaction

    def pg_grouped_transaction(self, conn, items, write, **options):
        # The group's size and time. lock_s: up to `more()`, called once the site locks
        # are held (without `more`, the locks go in the group's pipeline: 0).
        more, started = options.get("more"), time.perf_counter()
        if more is not None:
            def timed_more():
                _stats["lock_s"] += time.perf_counter() - started
                return more()
            options["more"] = timed_more
        return grouped_transaction(conn, items, write, options,
                                   call=lambda c, i, w, o: original_pg_group(self, c, i, w, **o))

    PostgresDatabase.grouped_transaction = pg_grouped_transaction


def dump() -> None:
    folder = os.environ.get(_OUT)
    if folder:
        Path(folder, f"{os.getpid()}.json").write_bytes(orjson.dumps(_stats))


# In the bench process ------------------------------------------------------------------
def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a worker's threads by OS name (the request threads, the writer, the
    rest: the main thread, the flush thread)."""
    by_name: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        key = name if name in ("tally-request", WRITER_THREAD) else "rest"
        by_name[key] = by_name.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / CLK_TCK
    return by_name


def profile(backend: str, duration: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="tally-payprof-") as tmp:
        folder = Path(tmp)
        out = folder / "stats"
        out.mkdir()
        os.environ[_OUT] = str(out)
        bench = Bench(workers=2, load=Load(duration=duration), folder=folder, backend=backend,
                      conf=CONF)
        with contextlib.ExitStack() as stack:
            stack.callback(bench.created.close)
            tally = bench.start_tally()
            stack.callback(tally.stop)
            sample = payment_bodies()
            bench.probe("/api/v1/payments", sample[0], 200)
            bodies = write_bodies(folder / "payments.txt", sample)
            pids = tally.worker_pids()
            before = {pid: thread_cpu(pid) for pid in pids}
            load_before = loadavg()
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            figures = run_wrk(tally.url + "/api/v1/payments", bodies, bench.load, key=bench.key)
            after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
            after = {pid: thread_cpu(pid) for pid in pids}
            load_after = loadavg()
            in_db = table_count(bench.database, "payments")
        stats = [orjson.loads(path.read_bytes()) for path in out.iterdir()]
    requests = figures["statuses"].get("200", 0)
    cpu = {}
    for pid in pids:
        for name, seconds in after[pid].items():
            cpu[name] = cpu.get(name, 0.0) + seconds - before[pid].get(name, 0.0)
    wrk_cpu = ((after_children.ru_utime + after_children.ru_stime)
               - (children.ru_utime + children.ru_stime))
    total = {key: sum(s[key] for s in stats) for key in stats[0] if key != "sizes"} if stats else {}
    if total:
        # commit_s held the group's time past the lock; its writes are counted apart.
        total["commit_s"] -= total["writes_s"]
    paid = max(total.get("payments", 0), 1)
    us = 1e6 / paid
    return {
        "backend": backend, "requests": requests, "payments_in_db": in_db,
        "requests_per_s": round(requests / figures["duration_s"]),
        "p50_ms": figures["latency_us"]["p50"] / 1e3,
        "p99_ms": figures["latency_us"]["p99"] / 1e3,
        "loadavg": [load_before, load_after],
        "cpu_us_per_payment": {name: round(seconds * 1e6 / max(requests, 1), 1)
                               for name, seconds in sorted(cpu.items())},
        "wrk_cpu_us_per_payment": round(wrk_cpu * 1e6 / max(requests, 1), 1),
        "writer_us_per_payment": {
            key: round(total[key] * us, 1)
            for key in ("lock_s", "writes_s", "writes_cpu_s", "commit_s", "group_s",
                        "group_cpu_s")} if total else {},
        "payments_per_group": round(paid / max(total.get("groups", 1), 1), 1),
        "commit_ms_per_group": round(total.get("commit_s", 0) * 1e3 / max(total.get("groups", 1), 1), 2),
        "lock_ms_per_group": round(total.get("lock_s", 0) * 1e3 / max(total.get("groups", 1), 1), 2),
        "groups_per_s": round(total.get("groups", 0) / figures["duration_s"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="sqlite", choices=("sqlite", "postgres"))
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.runs):
        print(orjson.dumps(profile(args.backend, args.duration)).decode(), flush=True)


if __name__ == "__main__":
    main()
