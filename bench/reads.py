"""The read-abuse scenario of issue 26: what the worst reads within the documented limits
cost over 1,000,000 events, and what ten of them at once do to ingestion.

    .venv/bin/python -m bench.reads [--events 1000000] [--backend sqlite postgres]
                                    [--budget 1.8] [--duration 10] [--rate 200]
    make bench-reads                    [--side-by-side]

For each backend: a site whose 1,000,000 events and their sessions span 30 days (written
straight through storage, bench/read_data.py), a real gunicorn (the repo's
gunicorn.conf.py, 2 workers) with the default read budget (TALLY_READ_BUDGET, or
--budget). Then:

- handler: SQLite's progress handler (the budget's check) measured in this process: one
  scan of every event's figures with no handler, and with one every N steps.
- worst: each worst request alone on the quiet service, three times: server CPU (the
  workers' /proc time, and PostgreSQL's backends' for its database), wall time, status.
  Ten `page~` filters of twenty values each (the documented 10 filters, 1,000 characters;
  the last value of each matches most pages, so every filter is evaluated), over 31 days:
  the aggregate; the time series by hour with compare=previous_period; the shared-link
  dashboard page with those filters (every report of the page, as an anonymous viewer).
- unbounded: the same reports run to their end in this process with no budget (CPU
  seconds of this process), so the cost the budget cuts is seen.
- ingest: POST /api/v1/events (single events, wrk at a fixed rate) p50/p99 on the quiet
  service, then while ten clients send the worst requests back to back; three rounds of
  both, and the medians compared (the machine may be shared).
- side_by_side (--side-by-side): both halves at the same moments, so that other work on
  the machine weighs on both alike: two services on the same data, each gunicorn in a
  session of its own (as under systemd; with the kernel's autogroup each is then one
  scheduling group), wrk at the same rate on both while the ten worst reads go to one;
  each round's ratio of the two p99s, and their median. What the reads cost the machine
  (PostgreSQL's backends, or cores the reads keep busy) weighs on both halves, so this
  ratio shows what they do to their own service beyond that; the rounds above show all.
- ingest_postgres_cpu_weight (--postgres-cpu-weight W, PostgreSQL, root): the ingest rounds
  again with the server's processes in a CPU group of weight W, as a `CPUWeight=W` drop-in
  for postgresql@.service does on a box that runs both (docs/deploy/systemd).

It reports and fails nothing (a step that cannot run is recorded as an error). Figures are
written to bench/results/reads.json and printed; the machine's load average is recorded
before and after each step: the machine may be shared.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sqlite3
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import orjson

from bench.bodies import SITE_HOSTS, single_event_bodies
from bench.measure import (
    REPO,
    CpuWeightUnavailable,
    DatabaseProbe,
    Load,
    Service,
    WorkerProbe,
    database_env,
    http,
    loadavg,
    machine_info,
    open_target,
    postgres_cpu_weight,
    postgres_database,
    run_wrk,
    write_bodies,
)
from bench.read_data import HOST, fill

RESULTS = REPO / "bench" / "results" / "reads.json"
POSTGRES_URL = (os.environ.get("TALLY_BENCH_DATABASE_URL")
                or os.environ.get("TALLY_TEST_DATABASE_URL")
                or "postgresql://postgres@127.0.0.1:5432/test")
DAY_S = 86_400


def worst_filters() -> str:
    """10 `page~` filters of 20 values, 829 characters: the documented limits are 10
    filters, 50 values each, 1,000 characters. Values are sorted, so the one matching
    most pages (`t`) comes last and every value of every filter is tried."""
    filters = ";".join(
        "page~" + "|".join([f"q{chr(97 + i)}{k}" for i in range(19)] + ["t"])
        for k in range(10))
    assert len(filters) <= 1000
    return filters


def worst_paths(today: dt.date, share_token: str) -> dict[str, tuple[str, bool]]:
    """name -> (path, with the read key)."""
    first = today - dt.timedelta(days=30)
    span = f"from={first}&to={today}"
    filters = urllib.parse.quote(worst_filters(), safe="")
    return {
        "aggregate, 31 days, 10 page~ filters x 20 values":
            (f"/api/v1/stats/aggregate?{span}&filters={filters}", True),
        "timeseries by hour, 31 days, compare, the same filters":
            (f"/api/v1/stats/timeseries?interval=hour&compare=previous_period&{span}"
             f"&filters={filters}", True),
        "shared link page, 31 days, the same filters (anonymous)":
            (f"/share/{share_token}?{span}&filters={filters}", False),
        "shared link page, 7 days, no filter (anonymous)":
            (f"/share/{share_token}?period=7d", False),
    }


def handler_cost(db_path: str) -> dict:
    """CPU of one scan over every event, without SQLite's progress handler and with one
    called every N steps (what the read budget adds to every statement)."""
    conn = sqlite3.connect(db_path)
    statement = ("SELECT count(*) FILTER (WHERE name = 'pageview'), count(DISTINCT visitor_id)"
                 " FROM events WHERE site_id = ? AND ts >= ? AND ts < ?")
    site_id = conn.execute("SELECT min(id) FROM sites").fetchone()[0]
    deadline = time.monotonic() + 3600
    variants = (None, 1_000, 10_000, 100_000)
    runs: dict = {steps: [] for steps in variants}
    try:
        for _ in range(7):  # in turn, so a change in the machine's load hits every variant
            for steps in variants:
                if steps is None:
                    conn.set_progress_handler(None, 0)
                else:
                    conn.set_progress_handler(lambda: time.monotonic() >= deadline, steps)
                started = time.process_time()
                conn.execute(statement, (site_id, 0, 2**62)).fetchone()
                runs[steps].append(time.process_time() - started)
    finally:
        conn.close()
    figures = {"none" if steps is None else f"every {steps} steps": round(min(times), 3)
               for steps, times in runs.items()}
    base = figures["none"]
    return {"scan_cpu_s_best_of_7": figures,
            "overhead_at_100000": round(figures["every 100000 steps"] / base - 1, 3),
            "what": "one scan of every event (count and distinct visitors); the variants in"
                    " turn, 7 times, best of each"}


def unbounded(target: str, site_id: int, today: dt.date) -> list[dict]:
    """The worst reports run to their end in this process without a budget, as an
    anonymous viewer (nothing stored): the CPU the budget saves."""
    from reports.service import run_report

    db = open_target(target)
    first = today - dt.timedelta(days=30)
    params = {"from": first.isoformat(), "to": today.isoformat(), "filters": worst_filters()}
    results = []
    try:
        for name, extra in (("aggregate", {}),
                            ("timeseries", {"interval": "hour", "compare": "previous_period"})):
            database = DatabaseProbe(target).start()
            started, wall = time.process_time(), time.perf_counter()
            run_report(name, db, site_id, {**params, **extra}, time.time(),
                       stores_segments=False)
            result = {"report": name, **extra,
                      "process_cpu_s": round(time.process_time() - started, 2),
                      "wall_s": round(time.perf_counter() - wall, 2)}
            database_cpu = database.finish()
            if database_cpu is not None:
                result["database_cpu_s"] = database_cpu
            results.append(result)
    finally:
        db.close()
    return results


def timed_request(service: Service, target: str, path: str, headers: dict) -> dict:
    probe = WorkerProbe(service.worker_pids()).start()
    database = DatabaseProbe(target).start()
    started = time.perf_counter()
    status, body = http("GET", service.url + path, headers=headers)
    wall = time.perf_counter() - started
    cpu = probe.finish()
    result = {"status": status, "wall_s": round(wall, 3), "server_cpu_s": cpu["cpu_s"]}
    database_cpu = database.finish()
    if database_cpu is not None:
        result["database_cpu_s"] = database_cpu
    if status != 200:
        with contextlib.suppress(ValueError):
            result["error"] = orjson.loads(body)["error"]["code"]
        if b"Too much to count" in body:
            result["error"] = "page: Too much to count"
    return result


class Hammer:
    """`clients` threads sending the worst requests back to back until stopped."""

    def __init__(self, url: str, requests: list[tuple[str, dict]], clients: int = 10):
        self.url = url
        self.requests = requests
        self.clients = clients
        self.stop_event = threading.Event()
        self.statuses: dict[str, int] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(n,), daemon=True)
                        for n in range(clients)]

    def _run(self, n: int) -> None:
        i = n
        while not self.stop_event.is_set():
            path, headers = self.requests[i % len(self.requests)]
            i += 1
            try:
                status, _ = http("GET", self.url + path, headers=headers)
            except OSError:
                status = 0
            with self.lock:
                self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1

    def __enter__(self) -> Hammer:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=120)


def ingest_latency(service: Service, bodies: Path, key: str, duration: int, rate: float) -> dict:
    figures = run_wrk(service.url + "/api/v1/events", bodies,
                      Load(threads=2, connections=8, duration=duration), rate_rps=rate, key=key)
    latency = figures["latency_us"]
    return {"p50_ms": round(latency["p50"] / 1000, 2), "p90_ms": round(latency["p90"] / 1000, 2),
            "p99_ms": round(latency["p99"] / 1000, 2), "max_ms": round(latency["max"] / 1000, 2),
            "requests_per_s": round(figures["requests"] / figures["duration_s"], 1),
            "statuses": figures["statuses"], "late": figures["late"],
            "errors": {k: v for k, v in figures["errors"].items() if v}}


def ingest_rounds(service: Service, bodies: Path, key: str, hammering: list, args, log,
                  backend: str) -> dict:
    """Rounds of (quiet, then while ten clients send the worst reads back to back): the
    machine may be shared, so each round's figures are kept and the medians compared."""
    rounds = []
    for n in range(args.rounds):
        quiet = ingest_latency(service, bodies, key, args.duration, args.rate)
        quiet["load"] = loadavg()
        probe = WorkerProbe(service.worker_pids()).start()
        with Hammer(service.url, hammering, clients=10) as hammer:
            time.sleep(2)  # the ten are running
            busy = ingest_latency(service, bodies, key, args.duration, args.rate)
            busy["load"] = loadavg()
        busy["server_cpu_s"] = probe.finish()["cpu_s"]
        busy["worst_requests_answered"] = dict(sorted(hammer.statuses.items()))
        rounds.append({"quiet": quiet, "with_10_worst_reads": busy})
        log(f"reads/{backend}: round {n + 1}: events p99 quiet {quiet['p99_ms']} ms, with 10"
            f" worst reads {busy['p99_ms']} ms (load {busy['load'][0]})")

    def median(kind: str, figure: str) -> float:
        values = sorted(r[kind][figure] for r in rounds)
        return values[len(values) // 2]

    summary = {f"{kind}_{figure}_median": median(kind, figure)
               for kind in ("quiet", "with_10_worst_reads") for figure in ("p50_ms", "p99_ms")}
    summary["p99_ratio_of_medians"] = round(
        summary["with_10_worst_reads_p99_ms_median"] / summary["quiet_p99_ms_median"], 2)
    ratios = sorted(r["with_10_worst_reads"]["p99_ms"] / r["quiet"]["p99_ms"] for r in rounds)
    summary["p99_ratio_median_of_rounds"] = round(ratios[len(ratios) // 2], 2)
    return {"rate_rps": args.rate, "seconds_each": args.duration, **summary, "rounds": rounds}


def weighted_rounds(service: Service, bodies: Path, key: str, hammering: list, args,
                    log) -> dict:
    """The ingest rounds again with the PostgreSQL server in a CPU group of
    --postgres-cpu-weight (its reads then weigh less than the service's workers)."""
    weight = args.postgres_cpu_weight
    try:
        with postgres_cpu_weight(args.postgres_url, weight):
            rounds = ingest_rounds(service, bodies, key, hammering, args, log,
                                   f"postgres, CPUWeight={weight}")
    except CpuWeightUnavailable as exc:
        return {"status": "skipped", "reason": str(exc)}
    return {"cpu_weight": weight, **rounds}


def side_by_side(services: tuple[Service, Service], bodies: Path, key: str, hammering: list,
                 args, log, backend: str) -> dict:
    """Rounds in which the events p99 of `services` (quiet, busy) is measured at the same
    time, while ten clients send the worst reads to the busy one."""
    quiet_service, busy_service = services
    rounds = []
    for n in range(args.rounds):
        figures: dict = {}

        def measure(name: str, service: Service, figures: dict = figures) -> None:
            figures[name] = ingest_latency(service, bodies, key, args.duration, args.rate)

        with Hammer(busy_service.url, hammering, clients=10) as hammer:
            time.sleep(2)  # the ten are running
            threads = [threading.Thread(target=measure, args=pair)
                       for pair in (("quiet", quiet_service),
                                    ("with_10_worst_reads", busy_service))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        load = loadavg()
        quiet, busy = figures["quiet"], figures["with_10_worst_reads"]
        busy["worst_requests_answered"] = dict(sorted(hammer.statuses.items()))
        ratio = round(busy["p99_ms"] / quiet["p99_ms"], 2)
        rounds.append({"quiet": quiet, "with_10_worst_reads": busy, "p99_ratio": ratio,
                       "load": load})
        log(f"reads/{backend}: side by side {n + 1}: events p99 quiet {quiet['p99_ms']} ms,"
            f" with 10 worst reads {busy['p99_ms']} ms, {ratio}x (load {load[0]})")
    ratios = sorted(r["p99_ratio"] for r in rounds)
    return {"rate_rps": args.rate, "seconds_each": args.duration,
            "p99_ratio_median": ratios[len(ratios) // 2] if ratios else None, "rounds": rounds}


def run_backend(backend: str, args, folder: Path, log) -> dict:
    from storage.directory import Directory
    from storage.shares import SharedLinks

    with contextlib.ExitStack() as stack:
        if backend == "postgres":
            target = stack.enter_context(postgres_database(args.postgres_url, "bench_reads"))
        else:
            target = str(folder / "reads.db")
        now = time.time()
        db = open_target(target)
        try:
            directory = Directory(db, lambda: now - 31 * DAY_S)
            account = directory.create_account("Bench", "scale")
            site = directory.create_site(account["id"], [HOST, *SITE_HOSTS])
            site_id = directory.find_site(site["id"]).id
            read_key = directory.create_key(site["id"], ["read"])["key"]
            events_key = directory.create_key(site["id"], ["events"])["key"]
            token = SharedLinks(db, lambda: now).create(site["id"], revenue=True)["token"]
            log(f"reads/{backend}: writing {args.events:,} events ...")
            started, cpu = time.perf_counter(), time.process_time()
            written = fill(db, site_id, args.events, 30, int(now * 1000))
            written.update(seconds=round(time.perf_counter() - started, 1),
                           cpu_s=round(time.process_time() - cpu, 1))
        finally:
            db.close()
        from config import READ_BUDGET

        budget = READ_BUDGET if args.budget is None else args.budget
        result: dict = {"backend": backend, "data": written, "budget_s": budget}
        today = dt.datetime.fromtimestamp(now, dt.UTC).date()
        if backend == "sqlite":
            result["handler"] = handler_cost(target)
        if args.unbounded:  # first, while nothing is stored: the whole cost of a first read
            log(f"reads/{backend}: the worst reports without a budget ...")
            result["unbounded"] = unbounded(target, site_id, today)
        env = {**database_env(target), "TALLY_LOG_LEVEL": "WARNING",
               "TALLY_READ_BUDGET": str(budget)}
        service = Service("app:app", REPO / "gunicorn.conf.py", args.workers,
                          folder / f"reads-{backend}.log", env).wait_ready()
        try:
            read_headers = {"Authorization": f"Bearer {read_key}"}
            paths = worst_paths(today, token)
            worst = []
            for name, (path, keyed) in (paths.items() if args.alone else ()):
                runs = []
                for _ in range(3):
                    runs.append(timed_request(service, target, path,
                                              read_headers if keyed else {}))
                worst.append({"request": name, "load_before": loadavg(), "runs": runs})
                log(f"reads/{backend}: {name}: {runs}")
            result["worst"] = worst
            bodies = write_bodies(folder / "reads-events.txt", single_event_bodies(site["id"]))
            hammering = [(path, read_headers if keyed else {})
                         for path, keyed in list(paths.values())[:3]]
            result["ingest"] = ingest_rounds(service, bodies, events_key, hammering, args, log,
                                             backend)
            if backend == "postgres" and args.postgres_cpu_weight:
                result["ingest_postgres_cpu_weight"] = weighted_rounds(
                    service, bodies, events_key, hammering, args, log)
        finally:
            service.stop()
        if args.side_by_side:
            pair: list[Service] = []
            try:
                for half in ("quiet", "busy"):
                    pair.append(Service("app:app", REPO / "gunicorn.conf.py", args.workers,
                                        folder / f"reads-{backend}-{half}.log", env,
                                        own_session=True).wait_ready())
                result["side_by_side"] = side_by_side(tuple(pair), bodies, events_key,
                                                      hammering, args, log, backend)
            finally:
                for half_service in pair:
                    half_service.stop()
        return result


def parse_options(argv=None) -> argparse.Namespace:
    """The bench's options; `make bench` (bench.run) builds its own through this too."""
    parser = argparse.ArgumentParser(prog="bench.reads", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--backend", nargs="+", choices=("sqlite", "postgres"),
                        default=["sqlite"])
    parser.add_argument("--postgres-url", default=POSTGRES_URL)
    parser.add_argument("--budget", type=float, default=None,
                        help="TALLY_READ_BUDGET (default: the service's)")
    parser.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS") or 2))
    parser.add_argument("--duration", type=int, default=10, help="seconds of each wrk run")
    parser.add_argument("--rate", type=float, default=200, help="events requests a second")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of quiet / busy ingestion latency")
    parser.add_argument("--side-by-side", action="store_true",
                        help="also measure quiet and busy at the same time, on two services")
    parser.add_argument("--no-alone", dest="alone", action="store_false",
                        help="skip timing each worst request alone")
    parser.add_argument("--postgres-cpu-weight", type=int, default=None, metavar="WEIGHT",
                        help="PostgreSQL only: also run the ingest rounds with the server in a"
                             " CPU group of this weight (systemd's CPUWeight; 100 is the"
                             " default; needs root and a local server)")
    parser.add_argument("--no-unbounded", dest="unbounded", action="store_false",
                        help="skip running the worst reports to their end without a budget")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_options(argv)

    def log(line: str) -> None:
        print(line, flush=True)

    document = {"started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": machine_info(), "backends": {}}
    with tempfile.TemporaryDirectory(prefix="tally-bench-reads-") as folder:
        for backend in args.backend:
            try:
                document["backends"][backend] = run_backend(backend, args, Path(folder), log)
            except Exception as exc:  # a bench reports; it never stops on a failure
                document["backends"][backend] = {"status": "error",
                                                 "reason": f"{type(exc).__name__}: {exc}"[:500]}
                log(f"reads/{backend}: error {exc}")
    document["machine"]["loadavg_after"] = loadavg()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    print(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
