"""`make bench`: Tally's ingestion measured against its own ceilings, side by side in one run.

    .venv/bin/python -m bench.run [--workers 2] [--duration 10] [--only NAME ...] [--readme]
                                  [--backend sqlite postgres] [--postgres-url URL]

Everything runs on this machine against 127.0.0.1: real gunicorn (the repo's
gunicorn.conf.py) on a fresh temporary database set up with the real `tally` CLI, load
from wrk with bench/lua/post.lua. Each backend runs its scenarios in turn on databases of
its own: SQLite files in a temporary folder, or databases of the PostgreSQL server at
--postgres-url (created for the run, dropped after it). It reports and never fails on
figures: a scenario that cannot run is recorded as skipped or error, and the exit status
is 0. Only a missing wrk stops it (exit 2).

Figures: requests/s and events/s from wrk, p50/p99 from wrk's latency histogram, server CPU
from /proc/<pid>/stat of the gunicorn workers (flush thread included) before and after,
peak RSS per worker from VmHWM (reset through /proc/<pid>/clear_refs before each
scenario), events persisted counted in the database after the queues drained. On
PostgreSQL, the server's CPU for the bench database is read from its backends'
/proc/<pid>/stat besides (the server runs on this machine).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import runpy
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bench import hostile
from bench.bodies import (
    BATCH_SIZE,
    REFERRERS,
    SITE_HOSTS,
    USER_AGENTS,
    batch_bodies,
    collect_bodies,
    payment_bodies,
    single_event_bodies,
)
from bench.measure import (
    BIN,
    REPO,
    WRK,
    DatabaseProbe,
    Load,
    PersistWatch,
    Service,
    WorkerProbe,
    WrkMissing,
    cpu_seconds,
    database_env,
    events_bytes,
    http,
    loadavg,
    machine_info,
    open_target,
    postgres_database,
    run_wrk,
    table_count,
    write_bodies,
    wrk_path,
)
from bench.results import README, RESULTS, assemble, text_table, update_readme, write_results

# Offered batch rates (events/s) tried in turn until one is not sustained; one midpoint
# step between the last sustained rate and the first failure then refines the answer.
BATCH_LADDER = (10_000, 20_000, 30_000, 40_000, 50_000, 60_000, 70_000, 80_000, 100_000,
                120_000, 150_000, 200_000)
# PostgreSQL's flush costs more CPU an event on this machine (the server shares its cores):
# its ladder starts lower.
BATCH_LADDERS = {"sqlite": BATCH_LADDER,
                 "postgres": (2_500, 5_000, 7_500, 10_000, 15_000, 20_000, 30_000, 40_000,
                              50_000, 60_000, 80_000, 100_000)}
# A key of the shape storage.directory.KEY_PATTERN gives Tally's keys.
CEILING_KEY = "tly_" + "c" * 43
SCENARIOS = ("ceiling", "single", "collect", "batches", "payments", "slow_clients", "sqlite",
             "postgres", "flusher", "hosts", "reports", "hostile", "reads")
# What each backend runs, of those asked for: SQLite everything but PostgreSQL's raw insert
# and its hosts; PostgreSQL what depends on the database (the ceiling, the slow clients and
# the parsers do not) and several hosts writing one server.
BACKEND_SCENARIOS = {
    "sqlite": tuple(name for name in SCENARIOS if name not in ("postgres", "hosts")),
    "postgres": ("single", "batches", "payments", "postgres", "flusher", "hosts", "reports",
                 "reads"),
}
BACKENDS = tuple(BACKEND_SCENARIOS)
POSTGRES_URL = (os.environ.get("TALLY_BENCH_DATABASE_URL")
                or os.environ.get("TALLY_TEST_DATABASE_URL")
                or "postgresql://postgres@127.0.0.1:5432/test")
# What the tracking script sends to /api/v1/collect (no key; the agent is a header).
COLLECT_HEADERS = {"User-Agent": USER_AGENTS[0], "Content-Type": "text/plain"}
# Time bounds that keep a whole run well under ten minutes whatever the code's speed.
FLUSHER_SECONDS = 150
SLOW_REPORT_SECONDS = 5


class ScenarioSkipped(RuntimeError):
    """The scenario cannot run yet (for example its endpoint is not implemented)."""

@dataclass
class Bench:
    workers: int
    load: Load
    folder: Path
    quick: bool = False
    raw_rows: int = 500_000
    flusher_events: int = 1_000_000
    report_payments: int = 3_000
    backend: str = "sqlite"
    postgres_url: str = POSTGRES_URL  # the server, where the bench creates its databases
    tally: Service | None = None
    ceiling_service: Service | None = None
    ceiling_bodies: Path | None = None
    ceiling_rps: int = 0  # the ceiling's first round, which single events alternate with
    ceiling_rounds: int = 3
    database: str = ""  # the service's: a SQLite path or a PostgreSQL URL
    site: str = ""
    key: str = ""
    flusher_db: str = ""
    flusher_site: str = ""
    flush_interval: float = 1.0
    conf: Path = REPO / "gunicorn.conf.py"  # the service's gunicorn settings
    created: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def new_database(self, name: str) -> str:
        """A new, empty database of the bench's backend: a SQLite file in the folder, or a
        database of the PostgreSQL server (dropped by drop_databases)."""
        if self.backend == "postgres":
            return self.created.enter_context(postgres_database(self.postgres_url, f"bench_{name}"))
        return str(self.folder / f"{name}.db")

    # Tally under gunicorn ---------------------------------------------------------
    def start_tally(self) -> Service:
        if self.tally is not None:
            return self.tally
        self.database = self.new_database("tally")
        # The collect scenario measures what a worker can take, not one address's limit
        # (bench/collect_flood.py measures that).
        env = {**database_env(self.database), "TALLY_LOG_LEVEL": "WARNING",
               "TALLY_COLLECT_RATE": "0"}
        def run(*args: str) -> dict:
            proc = subprocess.run([str(BIN / "tally"), "--json", *args], capture_output=True,
                                  cwd=REPO, env={**os.environ, **env}, timeout=60)
            if proc.returncode != 0:
                raise RuntimeError(f"tally {args[0]} failed: {proc.stderr.decode()[-300:]}")
            return orjson.loads(proc.stdout)

        run("init")
        account = run("account", "create", "--name", "Bench", "--plan", "scale")
        hosts = [arg for host in SITE_HOSTS for arg in ("--host", host)]
        self.site = run("site", "create", "--account", account["id"], *hosts)["id"]
        self.key = run("key", "create", "--site", self.site, "--scope", "events",
                       "--scope", "payments", "--scope", "read")["key"]
        self.tally = Service("app:app", self.conf, self.workers,
                             self.folder / "tally.log", env).wait_ready()
        return self.tally

    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}

    def probe(self, path: str, body: bytes, ok: int) -> None:
        status, answer = http("POST", self.tally.url + path, body, self.auth())
        if status != ok:
            raise ScenarioSkipped(f"POST {path} answered {status}: {answer[:200]!r}")

    def closed_loop(self, service: Service, path: str, bodies: Path, events_per_request: int,
                    key: str | None = None, headers: dict | None = None) -> dict:
        watch = PersistWatch(self.database) if events_per_request and self.database else None
        probe = WorkerProbe(service.worker_pids()).start()
        database = DatabaseProbe(self.database if service is self.tally else "").start()
        figures = run_wrk(service.url + path, bodies, self.load, key=key, headers=headers)
        accepted = figures["statuses"].get("204", 0) * events_per_request
        if watch is not None:
            watch.wait_for(watch.start_id + accepted, quiet=self.flush_interval + 0.5,
                           timeout=30)
        return summarize(figures, probe.finish() | {"database_cpu_s": database.finish()},
                         events_per_request, watch)

    # The scenarios ----------------------------------------------------------------
    def ceiling(self) -> dict:
        """The bare-Falcon ceiling's first round. Its service stays up for the rounds the
        single events scenario alternates with it (stop_ceiling)."""
        self.stop_ceiling()
        self.ceiling_service = Service(
            "bench.ceiling_app:app", REPO / "bench" / "ceiling_gunicorn.conf.py",
            self.workers, self.folder / "ceiling.log").wait_ready()
        try:
            self.ceiling_bodies = write_bodies(self.folder / "ceiling.txt",
                                               single_event_bodies("site_x"))
            result = self.ceiling_round()
        except BaseException:
            self.stop_ceiling()
            raise
        self.ceiling_rps = result["requests_per_s"]
        return result | {"what": "bare Falcon app, POST answers 204 after reading the body"}

    def ceiling_round(self) -> dict:
        # The same request as Tally's single events, Authorization header included (a key
        # of the same shape, which the ceiling never reads): gunicorn parses both alike.
        return self.closed_loop(self.ceiling_service, "/api/v1/events", self.ceiling_bodies, 0,
                                CEILING_KEY)

    def stop_ceiling(self) -> None:
        if self.ceiling_service is not None:
            self.ceiling_service.stop()
            self.ceiling_service = None

    def single(self) -> dict:
        """Single events; where the ceiling ran just before, `ceiling_rounds` rounds of the
        two alternated, their ratio the median of each round's (this machine's speed moves
        within minutes, and one round of each once read Tally at 1.48x its ceiling)."""
        tally = self.start_tally()
        sample = single_event_bodies(self.site)
        self.probe("/api/v1/events", sample[0], 204)
        bodies = write_bodies(self.folder / "single.txt", sample)
        before = table_count(self.database, "events")
        result = self.closed_loop(tally, "/api/v1/events", bodies, 1, self.key)
        result["events_in_db"] = table_count(self.database, "events") - before
        result["body_bytes"] = round(sum(map(len, sample)) / len(sample))
        if self.ceiling_service is None:
            return result
        try:
            ceilings, singles = [self.ceiling_rps], [result["requests_per_s"]]
            for _ in range(self.ceiling_rounds - 1):
                ceilings.append(self.ceiling_round()["requests_per_s"])
                singles.append(self.closed_loop(tally, "/api/v1/events", bodies, 1,
                                                self.key)["requests_per_s"])
        finally:
            self.stop_ceiling()
        ratios = [round(s / c, 3) for s, c in zip(singles, ceilings, strict=True) if c]
        result["rounds"] = {"ceiling_requests_per_s": ceilings,
                            "single_requests_per_s": singles, "ratios": ratios}
        if ratios:
            result["ratio_to_ceiling"] = statistics.median(ratios)
        return result

    def collect(self) -> dict:
        """The tracking script's endpoint: one event a request, no key, a browser id."""
        tally = self.start_tally()
        sample = collect_bodies(self.site)
        status, answer = http("POST", tally.url + "/api/v1/collect", sample[0], COLLECT_HEADERS)
        if status != 204:
            raise ScenarioSkipped(f"POST /api/v1/collect answered {status}: {answer[:200]!r}")
        bodies = write_bodies(self.folder / "collect.txt", sample)
        before = table_count(self.database, "events")
        result = self.closed_loop(tally, "/api/v1/collect", bodies, 1, headers=COLLECT_HEADERS)
        result["events_in_db"] = table_count(self.database, "events") - before
        result["body_bytes"] = round(sum(map(len, sample)) / len(sample))
        return result

    def batch_step(self, events_per_s: int) -> dict:
        tally = self.tally
        bodies = self.folder / "batches.txt"
        watch = PersistWatch(self.database)
        before = table_count(self.database, "events")
        probe = WorkerProbe(tally.worker_pids()).start()
        database = DatabaseProbe(self.database).start()
        figures = run_wrk(tally.url + "/api/v1/events", bodies, self.load,
                          rate_rps=events_per_s / BATCH_SIZE, key=self.key)
        accepted = figures["statuses"].get("204", 0) * BATCH_SIZE
        watch.wait_for(watch.start_id + accepted, quiet=self.flush_interval + 0.5, timeout=60)
        step = summarize(figures, probe.finish() | {"database_cpu_s": database.finish()},
                         BATCH_SIZE, watch)
        step["offered_events_per_s"] = events_per_s
        step["rows_before"] = before
        step["events_in_db"] = table_count(self.database, "events") - before
        offered_requests = events_per_s / BATCH_SIZE * figures["duration_s"]
        step["kept_schedule"] = figures["requests"] >= 0.97 * offered_requests
        non_204 = figures["requests"] - figures["statuses"].get("204", 0)
        step["sustained"] = (non_204 == 0 and step["socket_errors"] == 0
                             and step["kept_schedule"] and step["events_in_db"] >= accepted)
        return step

    def batches(self) -> dict:
        self.start_tally()
        sample = batch_bodies(self.site)
        self.probe("/api/v1/events", sample[0], 204)
        write_bodies(self.folder / "batches.txt", sample)
        steps: list[dict] = []
        best = failure = None
        ladder = BATCH_LADDERS[self.backend]
        ladder = ladder[::3] if self.quick else ladder
        for rate in ladder:
            step = self.batch_step(rate)
            steps.append(step)
            if not step["sustained"]:
                failure = step
                break
            best = step
        if best is not None and failure is not None and not self.quick:
            middle = round((best["offered_events_per_s"] + failure["offered_events_per_s"])
                           / 2 / 1000) * 1000
            if best["offered_events_per_s"] < middle < failure["offered_events_per_s"]:
                step = self.batch_step(middle)
                steps.append(step)
                if step["sustained"]:
                    best = step
        result = {"steps": [_step_line(s) for s in steps],
                  "body_bytes": round(sum(map(len, sample)) / len(sample)),
                  "bytes_per_event": round(sum(map(len, sample)) / len(sample) / BATCH_SIZE)}
        if best is None:
            result["sustained"] = None
            return result
        result["sustained"] = best
        at_80 = self.batch_step(round(best["offered_events_per_s"] * 0.8))
        result["at_80_percent"] = at_80
        return result

    def payments(self) -> dict:
        tally = self.start_tally()
        sample = payment_bodies()
        self.probe("/api/v1/payments", sample[0], 200)
        bodies = write_bodies(self.folder / "payments.txt", sample)
        probe = WorkerProbe(tally.worker_pids()).start()
        database = DatabaseProbe(self.database).start()
        figures = run_wrk(tally.url + "/api/v1/payments", bodies, self.load, key=self.key)
        result = summarize(figures, probe.finish() | {"database_cpu_s": database.finish()},
                           0, None, ok="200")
        result["payments_in_db"] = table_count(self.database, "payments")
        result["distinct_payment_ids"] = len({orjson.loads(b)["payment_id"] for b in sample})
        return result

    def sqlite(self) -> dict:
        """Raw executemany into the events table of schema.sql, same pragmas."""
        from storage.db import Database

        if not self.database or table_count(self.database, "events") == 0:
            raise ScenarioSkipped("needs events stored by the single/batches scenarios")
        sample_rows, columns = _sample_event_rows(self.database, 5_000)
        path = str(self.folder / "raw.db")
        conn = Database(path).connect()  # schema.sql, WAL, synchronous FULL, foreign keys
        try:
            copy_referenced_rows(conn, self.database, "events")
            txn = _flush_transaction_rows()
            ts_index = columns.index("ts") if "ts" in columns else None
            rows = _cycled_rows(sample_rows, self.raw_rows, ts_index)
            placeholders = ", ".join("?" * len(columns))
            sql = (f"INSERT INTO events ({', '.join(columns)})"  # noqa: S608 - columns read from PRAGMA table_info
                   f" VALUES ({placeholders})")
            started = time.perf_counter()
            for i in range(0, len(rows), txn):
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(sql, rows[i:i + txn])
                conn.execute("COMMIT")
            seconds = time.perf_counter() - started
            stored = conn.execute("SELECT count(*) FROM events").fetchone()[0]
            indexes = [r[1] for r in conn.execute("PRAGMA index_list(events)")]
        finally:
            conn.close()
        return {"rows": stored, "rows_per_s": round(stored / seconds),
                "transaction_rows": txn, "indexes": indexes,
                "row_bytes": _average_row_bytes(sample_rows),
                "what": "rows as the service stored them, executemany into a fresh database"}

    def postgres(self) -> dict:
        """The flush's events write three ways into a fresh database, at the flush's transaction
        size (bench/postgres_insert.py): executemany, multi-row INSERT, and COPY (storage's)."""
        from bench import postgres_insert

        url = self.new_database("raw")
        db = open_target(url)
        try:
            rows = postgres_insert.event_rows(db, max(1, self.raw_rows // 5))
            txn = _flush_transaction_rows()
            ways = postgres_insert.measure(db, rows, txn, 1, list(postgres_insert.WAYS)[:3])
        finally:
            db.close()
        return {"rows": len(rows), "rows_per_s": ways["COPY"]["rows_per_s"],
                "transaction_rows": txn, "ways": ways,
                "what": "enriched event rows, each way into an emptied events table; "
                        "rows_per_s is COPY's, what storage uses on PostgreSQL"}

    def slow_clients(self) -> dict:
        """/healthz while idle and slow-body clients hold connections (bench/hostile.py)."""
        return hostile.slow_clients(self.start_tally().url)

    def hostile(self) -> dict:
        """The worst caller-chosen text found for each parser, cost per call and request."""
        return hostile.parsers()

    def flusher(self) -> dict:
        return flusher_drain(self.new_database("flusher"), self.flusher_events, self)

    def hosts(self) -> dict:
        """One host's flush thread, then two hosts' at once (a process and a site each, the
        same number of events each), storing into the one server (bench/parallel_flush.py,
        `make bench-hosts`): issue 29 asks two not to be slower than one."""
        from bench import parallel_flush

        events = 30_000 if self.quick else 100_000
        one = parallel_flush.run(self.postgres_url, 1, events)
        two = parallel_flush.run(self.postgres_url, 2, events)
        return {"events_per_host": events, "one_host": one, "two_hosts": two,
                "events_per_s": two["events_per_s"],
                "two_over_one": round(two["events_per_s"] / one["events_per_s"], 2),
                "what": "flush threads alone, each host a process with its own site and full"
                        " queue; events/s from the first event to the last commit"}

    def reports(self) -> dict:
        """Each report over the flusher scenario's stored events, through the real service,
        after payments (linked to the events' `$identify` user ids) are posted."""
        if not self.flusher_db:
            raise ScenarioSkipped("needs the events stored by the flusher scenario")
        from storage.directory import Directory

        db = open_target(self.flusher_db)
        try:
            key = Directory(db, time.time).create_key(
                self.flusher_site, ["read", "payments"])["key"]
        finally:
            db.close()
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        service = Service("app:app", REPO / "gunicorn.conf.py", self.workers,
                          self.folder / "reports.log",
                          {**database_env(self.flusher_db), "TALLY_LOG_LEVEL": "WARNING"}
                          ).wait_ready()
        try:
            status, answer = http("GET", service.url + REPORT_PATHS[0][1], headers=headers)
            if status == 404:
                raise ScenarioSkipped(f"GET {REPORT_PATHS[0][1]} answered 404")
            sample = payment_bodies(count=self.report_payments, distinct=self.report_payments)
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(
                    lambda body: http("POST", service.url + "/api/v1/payments", body, headers)[0],
                    sample))
            if self.backend == "postgres":
                # As autovacuum would after a bulk load: the test server runs without it.
                from storage.postgres import analyze_schema, connect_as_is

                conn = connect_as_is(self.flusher_db)
                try:
                    analyze_schema(conn)
                finally:
                    conn.close()
            timings = [time_report(service.url + path, headers, name)
                       for name, path in REPORT_PATHS]
            stats_v2 = [time_report(service.url + path, headers, name)
                        for name, path in stats_v2_paths(datetime.date.today())]
        finally:
            service.stop()
        return {"events": table_count(self.flusher_db, "events"),
                "payments": table_count(self.flusher_db, "payments"),
                "payments_refused": sum(1 for status in answers if status != 200),
                "reports": timings,
                "stats_v2": stats_v2,
                "what": "GET each report 3 times through gunicorn; seconds is the median; "
                        "for stats_v2, runs_s[0] is the first time (final days counted and "
                        "stored) and runs_s[1:] answer from stored days"}

    def reads(self) -> dict:
        """The worst reads within the documented limits, alone and ten at once against
        ingestion (bench/reads.py, which runs alone too: make bench-reads)."""
        from bench import reads

        self.close()  # its own service on its own database, the machine otherwise quiet
        options = reads.parse_options([
            "--events", str(100_000 if self.quick else 1_000_000),
            "--workers", str(self.workers), "--duration", str(self.load.duration),
            "--rounds", str(1 if self.quick else 3), "--postgres-url", self.postgres_url,
            *(["--no-unbounded"] if self.quick else [])])
        return reads.run_backend(self.backend, options, self.folder,
                                 lambda line: print(line, file=sys.stderr, flush=True))

    def close(self) -> None:
        """Stop the services (the databases stay, for the scenarios after)."""
        self.stop_ceiling()
        if self.tally is not None:
            self.tally.stop()
            self.tally = None

    def drop_databases(self) -> str | None:
        """Stop the service and drop the PostgreSQL databases; why a drop failed, if one did."""
        self.close()
        try:
            self.created.close()
        except Exception as exc:  # a bench reports; a database left behind is said, not fatal
            return f"{type(exc).__name__}: {exc}"[:300]
        return None


REPORT_PATHS = (
    ("aggregate", "/api/v1/stats/aggregate"),
    ("revenue", "/api/v1/stats/revenue"),
    ("mrr", "/api/v1/stats/mrr"),
    ("movements", "/api/v1/stats/mrr/movements"),
    *((f"breakdown by {by}", f"/api/v1/stats/breakdown?by={by}")
      for by in ("channel", "source", "page", "entry_page", "country", "device", "browser",
                 "os", "event")),
)


def stats_v2_paths(today: datetime.date) -> tuple[tuple[str, str], ...]:
    """The reports of the Stats API v2, over the last 30 days unless said (hours: 7)."""
    week = f"from={today - datetime.timedelta(days=6)}&to={today}"
    return (
        ("timeseries", "/api/v1/stats/timeseries"),
        ("timeseries by week, filtered, compared",
         "/api/v1/stats/timeseries?interval=week&filters=visit:medium==email"
         "&compare=previous_period"),
        ("timeseries by hour, 7 days", f"/api/v1/stats/timeseries?interval=hour&{week}"),
        ("aggregate filtered, goal, compared",
         "/api/v1/stats/aggregate?filters=source==Google&goal=page:/pricing"
         "&compare=previous_period"),
        ("breakdown by page, filtered", "/api/v1/stats/breakdown?by=page&filters=channel!=Direct"),
        ("breakdown by source, goal", "/api/v1/stats/breakdown?by=source&goal=page:/signup"),
        ("revenue by source", "/api/v1/stats/revenue?by=source"),
        ("revenue by country, filtered, compared",
         "/api/v1/stats/revenue?by=country&filters=channel!=Direct&compare=previous_period"),
        ("revenue by campaign", "/api/v1/stats/revenue?by=campaign"),
        ("goals", "/api/v1/stats/goals"),
        ("realtime", "/api/v1/stats/realtime"),
        ("breakdown by page as CSV", "/api/v1/stats/breakdown?by=page&format=csv"),
    )


def time_report(url: str, headers: dict, name: str, runs: int = 3) -> dict:
    seconds, statuses = [], set()
    for _ in range(runs):
        started = time.perf_counter()
        status, _ = http("GET", url, headers=headers)
        seconds.append(time.perf_counter() - started)
        statuses.add(status)
        if seconds[-1] > SLOW_REPORT_SECONDS:
            break  # bounded: one run of a slow report says enough
    return {"name": name, "seconds": round(sorted(seconds)[len(seconds) // 2], 3),
            "runs_s": [round(x, 3) for x in seconds], "statuses": sorted(statuses)}


def summarize(figures: dict, server: dict, events_per_request: int,
              watch: PersistWatch | None, ok: str = "204") -> dict:
    seconds = figures["duration_s"] or 1e-9
    accepted_requests = figures["statuses"].get(ok, 0)
    events = accepted_requests * events_per_request
    work_units = events or accepted_requests
    result = {
        "requests": figures["requests"],
        "requests_per_s": round(figures["requests"] / seconds),
        "statuses": figures["statuses"],
        "socket_errors": sum(v for k, v in figures["errors"].items() if k != "status"),
        "p50_ms": round(figures["latency_us"]["p50"] / 1000, 2),
        "p99_ms": round(figures["latency_us"]["p99"] / 1000, 2),
        "max_ms": round(figures["latency_us"]["max"] / 1000, 2),
        "late_requests": figures.get("late", 0),
        "worker_cpu_s": server["cpu_s"],
        "request_thread_cpu_s": server["request_thread_cpu_s"],
        "cpu_us_per_request": round(server["cpu_s"] * 1e6 / accepted_requests, 1)
        if accepted_requests else None,
        "peak_rss_mib": server["peak_rss_mib"],
        "peak_rss_since": server["peak_rss_since"],
        "duration_s": round(seconds, 2),
    }
    if events_per_request:
        result["events_accepted"] = events
        result["events_per_s"] = round(events / seconds)
        result["cpu_us_per_event"] = round(server["cpu_s"] * 1e6 / work_units, 1)
        # The split: the threads that take requests in (bench.measure's
        # request_threads_cpu_seconds), and the rest: the flush thread, the payment writer.
        result["request_cpu_us_per_event"] = round(
            server["request_thread_cpu_s"] * 1e6 / work_units, 1)
        result["flush_cpu_us_per_event"] = round(
            (server["cpu_s"] - server["request_thread_cpu_s"]) * 1e6 / work_units, 1)
    if server.get("database_cpu_s") is not None:
        # PostgreSQL's share, in its own processes: the workers' CPU leaves it out.
        result["database_cpu_s"] = server["database_cpu_s"]
        per = "event" if events_per_request else "request"
        result[f"database_cpu_us_per_{per}"] = round(
            server["database_cpu_s"] * 1e6 / work_units, 1) if work_units else None
    if watch is not None:
        # Stored events over the load window: with the queue bounded, a run that ends with
        # everything stored and no 503 kept up all along (at most the queues were pending).
        result["events_persisted"] = watch.persisted
        result["persisted_events_per_s"] = round(watch.persisted / seconds)
        result["drain_s"] = round(max(0.0, watch.last_change - watch.started - seconds), 2)
    return result


def _step_line(step: dict) -> dict:
    keys = ("offered_events_per_s", "events_per_s", "persisted_events_per_s", "events_in_db",
            "statuses", "socket_errors", "late_requests", "kept_schedule", "p50_ms", "p99_ms",
            "cpu_us_per_event", "request_cpu_us_per_event", "flush_cpu_us_per_event",
            "database_cpu_us_per_event", "peak_rss_mib", "rows_before", "drain_s", "sustained")
    return {k: step.get(k) for k in keys}


def _sample_event_rows(db_path: str, limit: int) -> tuple[list[tuple], list[str]]:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(events)") if r[1] != "id"]
        query = f"SELECT {', '.join(columns)} FROM events ORDER BY id DESC LIMIT ?"  # noqa: S608 - columns from PRAGMA table_info
        rows = conn.execute(query, (limit,)).fetchall()
    finally:
        conn.close()
    return rows, columns


def copy_referenced_rows(conn: sqlite3.Connection, source: str, table: str) -> list[str]:
    """Copy the rows of every table `table` references (transitively) from `source`,
    so inserting its rows satisfies the foreign keys, which stay on."""
    conn.execute("ATTACH DATABASE ? AS src", (source,))
    try:
        wanted, queue = [], [table]
        while queue:
            current = queue.pop()
            # sql-safe: table names come from PRAGMA foreign_key_list of the schema
            for row in conn.execute(f"PRAGMA foreign_key_list({current})"):
                if row[2] not in wanted and row[2] != table:
                    wanted.append(row[2])
                    queue.append(row[2])
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("BEGIN IMMEDIATE")
        for parent in wanted:
            conn.execute(f"INSERT OR IGNORE INTO main.{parent} SELECT * FROM src.{parent}")  # noqa: S608 - names from PRAGMA foreign_key_list
        conn.execute("COMMIT")
    finally:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("DETACH DATABASE src")
    return wanted


def _cycled_rows(sample: list[tuple], count: int, ts_index: int | None) -> list[tuple]:
    """`count` rows cycling through `sample`, with ts rising as arrivals do."""
    if ts_index is None:
        return [sample[i % len(sample)] for i in range(count)]
    base = min(row[ts_index] for row in sample)
    out = []
    for i in range(count):
        row = list(sample[i % len(sample)])
        row[ts_index] = base + i // 60  # about 60,000 events a second
        out.append(tuple(row))
    return out


def _average_row_bytes(rows: list[tuple]) -> int:
    def size(value) -> int:
        if value is None:
            return 0
        if isinstance(value, (bytes, str)):
            return len(value.encode() if isinstance(value, str) else value)
        return 8
    return round(sum(sum(size(v) for v in row) for row in rows) / max(len(rows), 1))


def _flush_transaction_rows() -> int:
    """Rows per flush transaction under load: the queue's early-wake threshold."""
    from config import Config

    return max(1, Config().queue_max // 2)


def flusher_drain(target: str, events: int, bench: Bench | None = None,
                  spread_days: int = 30) -> dict:
    """The project's own flush thread alone storing `events` events into `target` (a new
    SQLite file's path or an empty PostgreSQL database's URL).

    A feeder keeps the worker's queue (TALLY_QUEUE_MAX, as in the service) topped up with
    prebuilt accepted units, so the flush thread works at its natural transaction size
    until all are stored. Receipt times spread over `spread_days` so the database is a
    realistic one for the reports scenario. Then the same drain with the write replaced
    by nothing splits enrichment from the write. On PostgreSQL the server's CPU for the
    database is measured besides the flush thread's.
    """
    try:
        from enrichment.enricher import Enricher
        from ingest.flusher import Flusher
        from ingest.queue import EventQueue
    except ImportError as exc:
        raise ScenarioSkipped(f"the flush code is not there yet: {exc}") from None
    import secrets

    from config import Config
    from storage.directory import Directory

    config = Config.from_env()
    db = open_target(target)
    directory = Directory(db, time.time)
    account = directory.create_account("Bench", "scale")
    site = directory.create_site(account["id"], list(SITE_HOSTS))
    record = directory.find_site(site["id"])
    end_ms = int(time.time() * 1000)
    units = accepted_units(record, events, end_ms - spread_days * 86_400_000, end_ms)

    def drain(units: list, **flusher_options) -> dict:
        queue = EventQueue(config.queue_max)
        flusher = Flusher(db, queue, Enricher(db, time.time, secrets.token_bytes),
                          interval=config.flush_interval, **flusher_options)
        flusher.start()
        flusher.flush_now(timeout=120)  # the thread has warmed up its parsers
        # Its CPU, read from /proc: the thread the Flusher started, found by its name.
        thread_id = next(t.native_id for t in threading.enumerate() if t.name == "tally-flush")
        cpu_before = cpu_seconds(os.getpid(), thread_id) or 0.0
        database = DatabaseProbe(target).start()
        started = time.perf_counter()
        deadline = started + FLUSHER_SECONDS
        count = 0
        for unit in units:
            while not queue.offer(unit):
                time.sleep(0.0005)
            count += len(unit.events)
            if time.perf_counter() > deadline:
                break  # bounded: the figures are those of the events fed so far
        done = flusher.flush_now(timeout=120)
        seconds = time.perf_counter() - started
        cpu = (cpu_seconds(os.getpid(), thread_id) or 0.0) - cpu_before
        database_cpu = database.finish()
        flusher.stop(timeout=60)
        figures = {"events": count, "seconds": round(seconds, 2),
                   "events_per_s": round(count / seconds), "finished": done,
                   "stopped_at_time_bound": count < sum(len(unit.events) for unit in units),
                   "cpu_us_per_event": round(cpu * 1e6 / count, 1)}
        if database_cpu is not None:
            figures["database_cpu_us_per_event"] = round(database_cpu * 1e6 / count, 1)
        return figures

    try:
        result = drain(units)
        result["events_stored"] = table_count(target, "events")
        stored_bytes = events_bytes(target)
        if stored_bytes and result["events_stored"]:
            result["bytes_per_event"] = round(stored_bytes / result["events_stored"])
        result["queue_max"] = config.queue_max
        result["what"] = ("ingest.flusher.Flusher in the bench process, its queue kept full; "
                          "CPU is the flush thread's"
                          + ("; database CPU is PostgreSQL's for this database"
                             if "database_cpu_us_per_event" in result else ""))
        if bench is not None:
            bench.flusher_db, bench.flusher_site = target, site["id"]
        result["enrich_only"] = drain(units[: max(1, len(units) // 5)],
                                      write=lambda conn, batch: None)
        result["enrich_only"]["what"] = "the same drain with the write replaced by nothing"
    finally:
        db.close()
    return result


def accepted_units(site, events: int, start_ms: int, end_ms: int) -> list:
    """`events` accepted events in 50-event units as the events endpoint queues them,
    with receipt times rising evenly from `start_ms` to `end_ms`. Their bodies are the
    batch bodies plus, in each batch, a referrer (some with UTM tags) on the first event
    and a `$identify` of one of the payment customers' user ids on the last."""
    from enrichment.visitor import utc_day
    from ingest.queue import Accepted
    from quota.usage import month_of
    from validation.event import IDENTIFY, parse_events

    pool = []
    for n, body in enumerate(batch_bodies(site.public_id, count=200, seed=77)):
        batch = orjson.loads(body)
        first, last = batch["b"][0], batch["b"][-1]
        first["r"] = REFERRERS[n % len(REFERRERS)]
        if n % 3 == 0:
            first["u"] += f"?utm_source=newsletter&utm_medium=email&utm_campaign=c{n % 4}"
        last.update(e=IDENTIFY, uid=f"user_{n % 400}")
        pool.append(parse_events(batch, end_ms)[1])
    count = -(-events // BATCH_SIZE)
    step = (end_ms - start_ms) / max(count, 1)
    units = []
    for i in range(count):
        received = int(start_ms + i * step)
        clean = [event._replace(ts=received) for event in pool[i % len(pool)]]
        counted = sum(1 for event in clean if event.name != IDENTIFY)
        units.append(Accepted(site.id, site.account_id, month_of(received / 1000),
                              utc_day(received), clean, counted))
    return units


# Main ---------------------------------------------------------------------------------


def run_scenario(name: str, fn: Callable[[], dict], log: Callable[[str], None]) -> dict:
    log(f"bench: {name} ...")
    started = time.monotonic()
    try:
        result = {"status": "ok", **fn()}
    except ScenarioSkipped as exc:
        result = {"status": "skipped", "reason": str(exc)}
    except WrkMissing:
        raise
    except Exception as exc:  # a bench reports; it never stops on a scenario's failure
        result = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:500]}
    result["wall_s"] = round(time.monotonic() - started, 1)
    log(f"bench: {name} {result['status']} in {result['wall_s']} s")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS") or 2))
    parser.add_argument("--duration", type=int, default=10, help="seconds per load step")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--quick", action="store_true", help="fewer ladder steps, smaller sets")
    parser.add_argument("--flusher-events", type=int, default=None,
                        help="events the flusher stores for the reports (default 1,000,000;"
                             " 100,000 with --quick)")
    parser.add_argument("--backend", nargs="+", choices=BACKENDS, default=list(BACKENDS),
                        help="the databases to measure, each with its scenarios")
    parser.add_argument("--postgres-url", default=POSTGRES_URL,
                        help="the PostgreSQL server; the bench creates databases of its own"
                             " there (its role may create databases)")
    parser.add_argument("--ceiling-rounds", type=int, default=3,
                        help="rounds of the ceiling and single events alternated (1 with --quick)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--readme", action="store_true", help="rewrite README's bench block")
    parser.add_argument("--wrk", default="wrk", help="the wrk command")
    args = parser.parse_args(argv)
    WRK["command"] = args.wrk
    try:
        wrk_path()
    except WrkMissing as exc:
        print(exc, file=sys.stderr)
        return 2

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    machine = machine_info()
    load = Load(args.threads, args.connections, args.duration)
    settings = {"workers": args.workers, "wrk_threads": load.threads,
                "wrk_connections": load.connections, "step_seconds": load.duration,
                "quick": args.quick, "batch_driver": "wrk + bench/lua/post.lua slot schedule"}
    backends = [b for b in args.backend if set(BACKEND_SCENARIOS[b]) & set(args.only)]
    settings["backends"] = backends
    gunicorn_settings = runpy.run_path(str(REPO / "gunicorn.conf.py"))
    settings["worker_class"] = (f"{gunicorn_settings['worker_class']}, "
                                f"{gunicorn_settings['threads']} threads (Tally and the ceiling)")
    runs: dict[str, dict] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tally-bench-") as folder:
        for backend in backends:
            bench = Bench(args.workers, load, Path(folder) / backend, quick=args.quick,
                          backend=backend, postgres_url=args.postgres_url)
            bench.folder.mkdir()
            bench.ceiling_rounds = args.ceiling_rounds
            if args.quick:
                bench.raw_rows, bench.flusher_events, bench.report_payments = 100_000, 100_000, 500
                bench.ceiling_rounds = 1
            if args.flusher_events:
                bench.flusher_events = args.flusher_events
            if backend == "postgres":
                machine["postgresql"] = postgres_version(args.postgres_url)
            runs[backend] = run_backend(bench, [n for n in BACKEND_SCENARIOS[backend]
                                                if n in args.only], machine, log)
    settings["flusher_events"] = bench.flusher_events if backends else None
    machine["loadavg_after"] = loadavg()
    settings["total_seconds"] = round(time.monotonic() - started, 1)
    doc = assemble(machine, settings, runs.get("sqlite", {}), postgres=runs.get("postgres"))
    write_results(doc, args.out)
    print(text_table(doc))
    print(f"\nwritten: {args.out}")
    if args.readme and update_readme(doc):
        print(f"updated: {README.relative_to(REPO)} (Performance)")
    return 0


def postgres_version(url: str) -> str:
    """The server's version, or why it cannot be reached."""
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            return "PostgreSQL " + conn.execute("SHOW server_version").fetchone()[0]
    except psycopg.Error as exc:
        return f"unreachable: {str(exc).strip()[:200]}"


def run_backend(bench: Bench, names: list[str], machine: dict,
                log: Callable[[str], None]) -> dict:
    """The scenarios `names` on the bench's backend, in order; its databases dropped after."""
    if machine.get("postgresql", "").startswith("unreachable") and bench.backend == "postgres":
        from storage.postgres import redact

        reason = f"no PostgreSQL at {redact(bench.postgres_url)}: {machine['postgresql']}"
        log(f"bench: postgres skipped ({reason})")
        return {name: {"status": "skipped", "reason": reason} for name in names}
    scenarios: dict = {}
    try:
        for name in names:
            if name in ("flusher", "hosts"):
                bench.close()  # flush threads run alone, with no server using CPU
            scenarios[name] = run_scenario(f"{bench.backend} {name}", getattr(bench, name), log)
            if name == "ceiling" and "single" not in names:
                bench.stop_ceiling()
    finally:
        failure = bench.drop_databases()
        if failure:
            log(f"bench: {bench.backend} databases not all dropped: {failure}")
    return scenarios


if __name__ == "__main__":
    sys.exit(main())
