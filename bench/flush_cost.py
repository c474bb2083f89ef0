"""CPU of the events flush per event, split into its steps, in-process (no HTTP, no wrk).

    .venv/bin/python -m bench.flush_cost [--events 100000] [--flush-units 1 50] [--runs 3]
                                         [--only random cycled repeated]

Builds accepted 50-event units the way the events endpoint queues them, then stores them
the way the flush thread does (ingest/pipeline.py): `enrich`, the BatchWriter's `prepare`
(the decisions, before the write lock), then the BatchWriter inside one
`Database.transaction` per flush of `--flush-units` units, on a fresh SQLite file with
the service's pragmas. CPU is this thread's (time.thread_time: Python and SQLite alike,
not the fsync wait). Under the lock: "check" (the decisions' reads run again), "sessions"
(the plan's writes, ingest.pipeline.write_sessions and write_session_changes), "insert" (the rest: browser links,
the events' INSERT, usage) and "commit"; "locked" is their sum.

Visitor mixes (each event's ip + ua decides its visitor):
- random: a new visitor for every event (each opens a session).
- cycled: the 200 batch bodies of `make bench` in turn (10,000 visitors), receipt times
  rising 1 s per unit: after the first 10,000 events every event continues a session.
- repeated: 2,000 visitors drawn at random, 1 s per unit: mostly continuing sessions,
  some new ones after 30-minute gaps.
Yesterday's salt exists, as on any server up for a day (receipt times are mid-afternoon
UTC, so only `$identify` events look yesterday's visitor id up). Every unit's last event
is a `$identify` of one of 400 customers' user ids, as the flusher drain of `make bench`
sends, and the site has those 400 customers (half linked by user id, a quarter also by
visitor id), so the first-touch triggers have work to do.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

import ingest.pipeline as pipeline
from bench.bodies import BATCH_SIZE, LEAN_USER_AGENTS, SITE_HOSTS, _public_ipv4, batch_bodies
from enrichment.enricher import Enricher
from enrichment.visitor import utc_day
from ingest.queue import Accepted
from storage.db import Database
from storage.directory import Directory
from storage.recorded import RecordedReads
from validation.event import IDENTIFY, parse_events

START_MS = 1_790_000_000_000
CUSTOMERS = 400
MIXES = ("random", "cycled", "repeated")


def _units(site, mix: str, events: int, seed: int = 8) -> Iterator[Accepted]:
    """Made as they are stored, so the process holds one flush of them, as a worker does."""
    rnd = random.Random(seed)
    pages = ("/", "/pricing", "/docs/getting-started", "/signup", "/changelog")
    cycled = [orjson.loads(body)["b"] for body in batch_bodies(site.public_id, seed=50)]
    pool = [(_public_ipv4(rnd), rnd.choice(LEAN_USER_AGENTS)) for _ in range(2_000)]
    for n in range(-(-events // BATCH_SIZE)):
        received = START_MS + n * 1_000
        if mix == "cycled":
            elements = [dict(e) for e in cycled[n % len(cycled)]]
        else:
            elements = []
            for _ in range(BATCH_SIZE):
                ip, ua = ((_public_ipv4(rnd), rnd.choice(LEAN_USER_AGENTS)) if mix == "random"
                          else rnd.choice(pool))
                elements.append({"e": "pageview", "u": f"https://example.com{rnd.choice(pages)}",
                                 "ip": ip, "ua": ua})
        elements[0]["r"] = "https://www.google.com/"
        elements[-1].update(e=IDENTIFY, uid=f"user_{n % CUSTOMERS}")
        clean = parse_events({"s": site.public_id, "b": elements}, received)[1]
        counted = sum(1 for event in clean if event.name != IDENTIFY)
        yield Accepted(site.id, site.account_id, "2026-09", utc_day(received), clean, counted)


def _add_customers(db: Database, site_id: int) -> None:
    with db.transaction() as conn:
        conn.executemany(
            "INSERT INTO customers (site_id, customer_id, user_id, visitor_id, as_of_ms,"
            " created_at, updated_at) VALUES (?, ?, ?, ?, 0, 0, 0)",
            [(site_id, f"cus_{n}", f"user_{n}" if n % 2 == 0 else None,
              str(n * 7919) if n % 4 == 0 else None) for n in range(CUSTOMERS)],
        )


def run(folder: Path, mix: str, events: int, flush_units: int) -> dict:
    db = Database(str(folder / f"flush-{mix}-{flush_units}.db"))
    directory = Directory(db, time.time)
    account = directory.create_account("Bench", "scale")
    site = directory.find_site(directory.create_site(account["id"], list(SITE_HOSTS))["id"])
    _add_customers(db, site.id)
    units = _units(site, mix, events)
    enricher = Enricher(db, lambda: START_MS / 1000, lambda n: bytes(range(n)))
    # A service up since yesterday: each event is also hashed under yesterday's salt.
    enricher.salts.salt(db.conn(), utc_day(START_MS) - 1)
    enricher.warm_up()
    conn = db.connect()
    spent = {"enrich": 0.0, "decide": 0.0, "check": 0.0, "sessions": 0.0, "insert": 0.0,
             "commit": 0.0}
    writer = pipeline.BatchWriter()
    write_sessions, unchanged = pipeline.write_sessions, RecordedReads.unchanged
    write_session_changes = pipeline.write_session_changes

    def timed(name, step):
        def run_step(*args):
            started = time.thread_time()
            try:
                return step(*args)
            finally:
                spent[name] += time.thread_time() - started
        return run_step

    pipeline.write_sessions = timed("sessions", write_sessions)
    pipeline.write_session_changes = timed("sessions", write_session_changes)
    RecordedReads.unchanged = timed("check", unchanged)
    wall = 0.0  # seconds spent storing (not making the units)
    try:
        while chunk := list(itertools.islice(units, flush_units)):
            started = time.perf_counter()
            t0 = time.thread_time()
            batch = pipeline.enrich(enricher, conn, chunk)
            t1 = time.thread_time()
            with pipeline.collector_paused():  # as the flush thread (ingest/flusher.py)
                prepared = writer.prepare(conn, batch)
                t2 = time.thread_time()
                with db.transaction(conn):
                    writer(conn, batch, prepared)
                    t3 = time.thread_time()
                del prepared  # freed before the collector runs again, as in the flush thread
            t4 = time.thread_time()
            wall += time.perf_counter() - started
            spent["enrich"] += t1 - t0
            spent["decide"] += t2 - t1
            spent["insert"] += t3 - t2
            spent["commit"] += t4 - t3
    finally:
        pipeline.write_sessions, RecordedReads.unchanged = write_sessions, unchanged
        pipeline.write_session_changes = write_session_changes
    locked = spent["insert"] + spent["commit"]
    spent["insert"] -= spent["sessions"] + spent["check"]
    if writer.decided_again:
        raise AssertionError("nothing else writes here: no batch may be decided again")
    stored = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    sessions = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
    conn.close()
    result = {name: round(seconds * 1e6 / stored, 2) for name, seconds in spent.items()}
    result["total"] = round(sum(spent.values()) * 1e6 / stored, 2)
    result["locked"] = round(locked * 1e6 / stored, 2)
    result.update(events=stored, session_rows=sessions, events_per_s=round(stored / wall))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench.flush_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--flush-units", type=int, nargs="+", default=[1, 50],
                        help="50-event units per flush transaction")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=MIXES, default=list(MIXES))
    args = parser.parse_args(argv)
    print("CPU us per event (median of runs): enrich | decide | check | sessions | insert |"
          " commit | total (under the write lock); in-process events/s")
    for flush_units in args.flush_units:
        for mix in args.only:
            results = []
            for _ in range(args.runs):
                with tempfile.TemporaryDirectory(prefix="tally-flush-") as folder:
                    results.append(run(Path(folder), mix, args.events, flush_units))
            med = {key: statistics.median(r[key] for r in results) for key in results[0]}
            print(f"{mix:>8} x{flush_units * BATCH_SIZE:>5}/flush: "
                  f"{med['enrich']:6.2f} | {med['decide']:6.2f} | {med['check']:5.2f} |"
                  f" {med['sessions']:6.2f} | {med['insert']:6.2f} | {med['commit']:5.2f} |"
                  f" {med['total']:6.2f} ({med['locked']:6.2f})"
                  f"  {med['events_per_s']:>8,.0f}/s"
                  f"  ({med['session_rows']:.0f} sessions; totals {[r['total'] for r in results]})",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
