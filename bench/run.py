"""`make bench`: Tally's ingestion measured against its own ceilings, side by side in one run.

    .venv/bin/python -m bench.run [--workers 2] [--duration 10] [--only NAME ...] [--readme]

Everything runs on this machine against 127.0.0.1: real gunicorn (`-k sync`, the repo's
gunicorn.conf.py) on a fresh temporary database set up with the real `tally` CLI, load
from wrk with bench/lua/post.lua. It reports and never fails on figures: a scenario that
cannot run is recorded as skipped or error, and the exit status is 0. Only a missing wrk
stops it (exit 2).

Figures: requests/s and events/s from wrk, p50/p99 from wrk's latency histogram, server CPU
from /proc/<pid>/stat of the gunicorn workers (flush thread included) before and after,
peak RSS per worker from VmHWM (reset through /proc/<pid>/clear_refs before each
scenario), events persisted counted in the database after the queues drained.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LUA = REPO / "bench" / "lua" / "post.lua"
RESULTS = REPO / "bench" / "results" / "latest.json"
README = REPO / "README.md"
README_START = "<!-- bench:start -->"
README_END = "<!-- bench:end -->"
RESULTS_SCHEMA = 1
CLK_TCK = os.sysconf("SC_CLK_TCK")

SITE_HOSTS = ("example.com", "www.example.com")
BATCH_SIZE = 50
MAX_EVENT_BODY = 8_192
# Offered batch rates (events/s) tried in turn until one is not sustained; one midpoint
# step between the last sustained rate and the first failure then refines the answer.
BATCH_LADDER = (10_000, 20_000, 30_000, 40_000, 50_000, 60_000, 70_000, 80_000, 100_000,
                120_000, 150_000, 200_000)
SCENARIOS = ("ceiling", "single", "batches", "payments", "sqlite", "flusher", "reports")


class WrkMissing(RuntimeError):
    """wrk is not installed."""


class ScenarioSkipped(RuntimeError):
    """The scenario cannot run yet (for example its endpoint is not implemented)."""


# Machine ------------------------------------------------------------------------------


def machine_info() -> dict:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
    return {
        "cores": os.cpu_count(),
        "cpu_model": model or platform.processor() or "unknown",
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "gunicorn": _version("gunicorn"),
        "falcon": _version("falcon"),
        "wrk": wrk_version(),
        "loadavg_before": _loadavg(),
    }


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


WRK = {"command": "wrk"}  # --wrk changes it


def wrk_path() -> str:
    path = shutil.which(WRK["command"])
    if path is None:
        raise WrkMissing("make bench needs wrk: apt-get install wrk")
    return path


def wrk_version() -> str:
    path = shutil.which(WRK["command"])
    if path is None:
        return "missing"
    proc = subprocess.run([path, "-v"], capture_output=True, text=True, timeout=10)
    first = (proc.stdout or proc.stderr).splitlines()
    return first[0].split(" [")[0] if first else "unknown"


# Worker processes ---------------------------------------------------------------------


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU of a process, all its threads included."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def reset_peak_rss(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@dataclass
class WorkerProbe:
    """CPU seconds and peak RSS of a set of worker processes over one scenario."""

    pids: list[int]
    cpu_before: dict[int, float] = field(default_factory=dict)
    rss_reset: bool = False

    def start(self) -> WorkerProbe:
        self.rss_reset = all([reset_peak_rss(pid) for pid in self.pids])
        self.cpu_before = {pid: cpu_seconds(pid) or 0.0 for pid in self.pids}
        return self

    def finish(self) -> dict:
        cpu = 0.0
        for pid, before in self.cpu_before.items():
            after = cpu_seconds(pid)
            if after is not None:
                cpu += after - before
        rss = [peak_rss_mib(pid) for pid in self.pids]
        return {"cpu_s": round(cpu, 3),
                "peak_rss_mib": [r for r in rss if r is not None],
                "peak_rss_since": "scenario start" if self.rss_reset else "worker start"}


# gunicorn -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Service:
    """A gunicorn master with its workers, serving `app_spec` on 127.0.0.1."""

    def __init__(self, app_spec: str, conf: Path, workers: int, log_path: Path,
                 env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(BIN / "gunicorn"), "-c", str(conf), "--bind", f"127.0.0.1:{self.port}",
             "--workers", str(workers), app_spec],
            cwd=REPO, env={**os.environ, **(env or {})},
            stdout=self._log, stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60) -> Service:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited: {self.log_tail()}")
            try:
                status, _ = http("GET", self.url + "/healthz")
                if status == 200 and len(self.worker_pids()) >= self.workers:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gunicorn not ready after {timeout} s: {self.log_tail()}")

    def worker_pids(self) -> list[int]:
        return children(self.proc.pid)

    def log_tail(self, lines: int = 20) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, timeout: float = 60) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def http(method: str, url: str, body: bytes | None = None,
         headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


# wrk ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    threads: int = 2
    connections: int = 16
    duration: int = 10


def run_wrk(url: str, bodies: Path, load: Load, *, rate_rps: float = 0,
            key: str | None = None) -> dict:
    """One wrk run; the figures of bench/lua/post.lua's WRK_JSON line."""
    env = {**os.environ, "BENCH_BODIES": str(bodies), "BENCH_THREADS": str(load.threads),
           "BENCH_RATE": f"{rate_rps:.3f}", "BENCH_KEY": key or ""}
    args = [wrk_path(), "-t", str(load.threads), "-c", str(load.connections),
            "-d", f"{load.duration}s", "--timeout", "10s", "-s", str(LUA), url]
    proc = subprocess.run(args, capture_output=True, text=True, env=env,
                          timeout=load.duration + 60)
    for line in proc.stdout.splitlines():
        if line.startswith("WRK_JSON "):
            figures = orjson.loads(line[len("WRK_JSON "):])
            figures["duration_s"] = figures.pop("duration_us") / 1e6
            return figures
    raise RuntimeError(f"wrk printed no figures: {proc.stdout[-500:]} {proc.stderr[-500:]}")


def write_bodies(path: Path, bodies: Sequence[bytes]) -> Path:
    path.write_bytes(b"\n".join(bodies) + b"\n")
    return path


# Request bodies -----------------------------------------------------------------------

USER_AGENTS = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/126.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/17.5 Safari/605.1.15",
    "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/126.0.0.0 Mobile Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:127.0) Gecko/20100101 Firefox/127.0",
    "Mozilla/5.0 (iPad; CPU OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/17.5 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/126.0.0.0 Safari/537.36 Edg/126.0.0.0",
)
# Short ones keep a 50-event batch under 8 KiB, as real batching clients must.
LEAN_USER_AGENTS = (
    "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (Windows NT 10.0; rv:127.0) Gecko/20100101 Firefox/127.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14.5; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (Android 14; Mobile; rv:128.0) Gecko/128.0 Firefox/128.0",
)
PAGES = ("/", "/pricing", "/blog/how-we-cut-our-cloud-bill-in-half", "/docs/getting-started",
         "/docs/api/events", "/signup", "/features/attribution", "/blog/mrr-explained",
         "/customers/acme", "/changelog")
REFERRERS = ("https://www.google.com/", "https://news.ycombinator.com/",
             "https://duckduckgo.com/", "https://t.co/xYz12AbC", "https://www.bing.com/")


def _public_ipv4(rnd: random.Random) -> str:
    while True:
        a = rnd.randrange(1, 224)
        if a not in (10, 100, 127, 169, 172, 192, 198, 203):
            return f"{a}.{rnd.randrange(256)}.{rnd.randrange(256)}.{rnd.randrange(1, 255)}"


def single_event_bodies(site: str, count: int = 500, seed: int = 8) -> list[bytes]:
    """Realistic single pageviews of about 600 bytes, with ip and ua."""
    rnd = random.Random(seed)
    bodies = []
    for i in range(count):
        page = rnd.choice(PAGES)
        event = {
            "s": site, "e": "pageview",
            "u": f"https://www.example.com{page}?utm_source=newsletter&utm_medium=email"
                 f"&utm_campaign=spring-launch-{i % 7}",
            "r": rnd.choice(REFERRERS),
            "t": "How we cut our cloud bill in half, and what it taught us about caching, "
                 "queues and SQLite | Example Engineering Blog",
            "w": rnd.choice((390, 768, 1280, 1440, 1920)), "l": "en-US",
            "ip": _public_ipv4(rnd), "ua": rnd.choice(USER_AGENTS),
            "p": {"author": "jane-doe", "category": "engineering", "ab": f"variant-{i % 3}",
                  "plan": rnd.choice(("free", "starter", "growth")), "logged_in": i % 2 == 0},
        }
        bodies.append(orjson.dumps(event))
    return bodies


def batch_bodies(site: str, count: int = 200, seed: int = 50) -> list[bytes]:
    """50-event batches under 8 KiB: lean events of about 160 bytes with ip and ua."""
    rnd = random.Random(seed)
    pages = [page for page in PAGES if len(page) <= 24]
    bodies = []
    while len(bodies) < count:
        events = [{"e": "pageview", "u": f"https://example.com{rnd.choice(pages)}",
                   "ip": _public_ipv4(rnd), "ua": rnd.choice(LEAN_USER_AGENTS)}
                  for _ in range(BATCH_SIZE)]
        body = orjson.dumps({"s": site, "b": events})
        if len(body) <= MAX_EVENT_BODY:  # the rare longer draw is drawn again
            bodies.append(body)
    return bodies


def payment_bodies(count: int = 2_000, distinct: int = 1_000, seed: int = 3) -> list[bytes]:
    """Payments with customer and subscription; ids repeat, so half are updates."""
    rnd = random.Random(seed)
    bodies = []
    for i in range(count):
        n = i % distinct
        amount = rnd.choice(("19", "49", "99.5", "249"))
        payment = {
            "payment_id": f"pay_bench_{n:06d}",
            "customer": {"id": f"cus_{n % 400:05d}", "email": f"Buyer{n % 400}@Example.com",
                         "user_id": f"user_{n % 400}", "name": "Jane Doe", "country": "DE"},
            "amount": float(amount), "currency": rnd.choice(("EUR", "USD")),
            "fee": 1.25, "kind": "charge", "paid_at": f"2026-11-{1 + n % 25:02d}T10:00:00Z",
            "status": "succeeded", "metadata": {"invoice": f"in_{n:06d}"},
            "subscription": {"id": f"sub_{n % 400:05d}", "plan": "pro", "interval": "month",
                             "status": "active", "amount": float(amount),
                             "started_at": "2026-01-01T00:00:00Z"},
        }
        bodies.append(orjson.dumps(payment))
    return bodies


# Database -----------------------------------------------------------------------------


def table_count(db_path: str, table: str) -> int:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)
    try:
        query = f"SELECT count(*) FROM {table}"  # noqa: S608 - table is events or payments, fixed here
        return conn.execute(query).fetchone()[0]
    finally:
        conn.close()


def max_event_id(db_path: str) -> int:
    """Cheap stand-in for count(*) while load runs: ids are dense (nothing is deleted)."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
    finally:
        conn.close()


class PersistWatch:
    """Samples the newest event id while load runs, to date when the last event landed."""

    def __init__(self, db_path: str, period: float = 0.25):
        self.db_path = db_path
        self.period = period
        self.started = time.monotonic()
        self.start_id = max_event_id(db_path)
        self.last_id = self.start_id
        self.last_change = self.started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            with contextlib.suppress(sqlite3.Error):
                current = max_event_id(self.db_path)
                if current != self.last_id:
                    self.last_id, self.last_change = current, time.monotonic()

    def wait_for(self, target_id: int, quiet: float, timeout: float) -> None:
        """Until the id reaches `target_id` and stays `quiet` s, or `timeout` s pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.last_id >= target_id and time.monotonic() - self.last_change >= quiet:
                break
            time.sleep(self.period)
        self._stop.set()
        self._thread.join()

    @property
    def persisted(self) -> int:
        return self.last_id - self.start_id



# Scenarios ----------------------------------------------------------------------------


@dataclass
class Bench:
    workers: int
    load: Load
    folder: Path
    quick: bool = False
    raw_rows: int = 500_000
    flusher_events: int = 1_000_000
    report_events: int = 1_000_000
    tally: Service | None = None
    db_path: str = ""
    site: str = ""
    key: str = ""
    flusher_db: str = ""
    flush_interval: float = 1.0

    # Tally under gunicorn ---------------------------------------------------------
    def start_tally(self) -> Service:
        if self.tally is not None:
            return self.tally
        self.db_path = str(self.folder / "tally.db")
        env = {"TALLY_DB": self.db_path, "TALLY_LOG_LEVEL": "WARNING"}
        cli = [str(BIN / "tally"), "--json"]
        run = lambda *args: orjson.loads(subprocess.run(  # noqa: E731
            [*cli, *args], capture_output=True, check=True, cwd=REPO,
            env={**os.environ, **env}, timeout=60).stdout)
        run("init")
        account = run("account", "create", "--name", "Bench", "--plan", "scale")
        hosts = [arg for host in SITE_HOSTS for arg in ("--host", host)]
        self.site = run("site", "create", "--account", account["id"], *hosts)["id"]
        self.key = run("key", "create", "--site", self.site, "--scope", "events",
                       "--scope", "payments", "--scope", "read")["key"]
        self.tally = Service("app:app", REPO / "gunicorn.conf.py", self.workers,
                             self.folder / "tally.log", env).wait_ready()
        return self.tally

    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}

    def probe(self, path: str, body: bytes, ok: int) -> None:
        status, answer = http("POST", self.tally.url + path, body, self.auth())
        if status != ok:
            raise ScenarioSkipped(f"POST {path} answered {status}: {answer[:200]!r}")

    def closed_loop(self, service: Service, path: str, bodies: Path, events_per_request: int,
                    key: str | None = None) -> dict:
        watch = PersistWatch(self.db_path) if events_per_request and self.db_path else None
        probe = WorkerProbe(service.worker_pids()).start()
        figures = run_wrk(service.url + path, bodies, self.load, key=key)
        accepted = figures["statuses"].get("204", 0) * events_per_request
        if watch is not None:
            watch.wait_for(watch.start_id + accepted, quiet=self.flush_interval + 0.5,
                           timeout=30)
        return summarize(figures, probe.finish(), events_per_request, watch)

    # The scenarios ----------------------------------------------------------------
    def ceiling(self) -> dict:
        service = Service("bench.ceiling_app:app", REPO / "bench" / "ceiling_gunicorn.conf.py",
                          self.workers, self.folder / "ceiling.log").wait_ready()
        try:
            bodies = write_bodies(self.folder / "ceiling.txt", single_event_bodies("site_x"))
            return self.closed_loop(service, "/api/v1/events", bodies, 0) | {
                "what": "bare Falcon app, POST answers 204 after reading the body"}
        finally:
            service.stop()

    def single(self) -> dict:
        tally = self.start_tally()
        sample = single_event_bodies(self.site)
        self.probe("/api/v1/events", sample[0], 204)
        bodies = write_bodies(self.folder / "single.txt", sample)
        before = table_count(self.db_path, "events")
        result = self.closed_loop(tally, "/api/v1/events", bodies, 1, self.key)
        result["events_in_db"] = table_count(self.db_path, "events") - before
        result["body_bytes"] = round(sum(map(len, sample)) / len(sample))
        return result

    def batch_step(self, events_per_s: int) -> dict:
        tally = self.tally
        bodies = self.folder / "batches.txt"
        watch = PersistWatch(self.db_path)
        before = table_count(self.db_path, "events")
        probe = WorkerProbe(tally.worker_pids()).start()
        figures = run_wrk(tally.url + "/api/v1/events", bodies, self.load,
                          rate_rps=events_per_s / BATCH_SIZE, key=self.key)
        accepted = figures["statuses"].get("204", 0) * BATCH_SIZE
        watch.wait_for(watch.start_id + accepted, quiet=self.flush_interval + 0.5, timeout=60)
        step = summarize(figures, probe.finish(), BATCH_SIZE, watch)
        step["offered_events_per_s"] = events_per_s
        step["rows_before"] = before
        step["events_in_db"] = table_count(self.db_path, "events") - before
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
        ladder = BATCH_LADDER[::3] if self.quick else BATCH_LADDER
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
        figures = run_wrk(tally.url + "/api/v1/payments", bodies, self.load, key=self.key)
        result = summarize(figures, probe.finish(), 0, None, ok="200")
        result["payments_in_db"] = table_count(self.db_path, "payments")
        result["distinct_payment_ids"] = len({orjson.loads(b)["payment_id"] for b in sample})
        return result

    def sqlite(self) -> dict:
        """Raw executemany into the events table of schema.sql, same pragmas."""
        from storage.db import Database

        if not self.db_path or table_count(self.db_path, "events") == 0:
            raise ScenarioSkipped("needs events stored by the single/batches scenarios")
        sample_rows, columns = _sample_event_rows(self.db_path, 5_000)
        path = str(self.folder / "raw.db")
        conn = Database(path).connect()  # schema.sql, WAL, synchronous FULL, foreign keys
        try:
            copy_referenced_rows(conn, self.db_path, "events")
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

    def flusher(self) -> dict:
        return flusher_drain(self.folder, self.flusher_events, self)

    def reports(self) -> dict:
        raise ScenarioSkipped("the reports issue has not landed yet")

    def close(self) -> None:
        if self.tally is not None:
            self.tally.stop()
            self.tally = None


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
            "cpu_us_per_event", "peak_rss_mib", "rows_before", "sustained")
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


def flusher_drain(folder: Path, events: int, bench: Bench | None = None,
                  enrich_only_events: int | None = None) -> dict:
    """The project's own flush code alone draining `events` queued events into SQLite,
    then (for the split of its cost) draining again with the write replaced by nothing."""
    try:
        from enrichment.enricher import Enricher
        from ingest.flusher import Flusher
        from ingest.queue import Accepted, EventQueue
        from validation.event import parse_events
    except ImportError as exc:
        raise ScenarioSkipped(f"the flush code is not there yet: {exc}") from None
    import resource
    import secrets

    from enrichment.visitor import utc_day
    from quota.usage import month_of
    from storage.db import Database
    from storage.directory import Directory

    path = str(folder / "flusher.db")
    db = Database(path)
    directory = Directory(db, time.time)
    account = directory.create_account("Bench", "scale")
    site = directory.create_site(account["id"], list(SITE_HOSTS))
    record = directory.find_site(site["id"])
    now = time.time()
    received_ms = int(now * 1000)
    units = []
    for body in batch_bodies(site["id"], count=200, seed=77):
        _, clean = parse_events(orjson.loads(body), received_ms)
        units.append(Accepted(record.id, record.account_id, month_of(now), utc_day(received_ms),
                              clean, len(clean)))

    def drain(count: int, **flusher_options) -> tuple[float, float, bool]:
        # flush_at above the count: nothing is flushed until everything is queued.
        queue = EventQueue(count + BATCH_SIZE, flush_at=count + BATCH_SIZE + 1)
        flusher = Flusher(db, queue, Enricher(db, time.time, secrets.token_bytes),
                          interval=3600, **flusher_options)
        flusher.start()
        flusher.flush_now(timeout=120)  # the thread has warmed up its parsers
        queued = 0
        while queued < count:
            unit = units[(queued // BATCH_SIZE) % len(units)]
            if not queue.offer(unit):
                raise RuntimeError("the bench queue refused a unit")
            queued += len(unit.events)
        cpu_before = time.process_time()
        started = time.perf_counter()
        done = flusher.flush_now(timeout=900)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu_before
        flusher.stop(timeout=60)
        return seconds, cpu, done

    seconds, cpu, done = drain(events)
    stored = table_count(path, "events")
    result = {"events_queued": events, "events_stored": stored, "finished": done,
              "seconds": round(seconds, 2), "events_per_s": round(stored / seconds),
              "cpu_us_per_event": round(cpu * 1e6 / max(stored, 1), 1),
              "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
              "what": "ingest.flusher.Flusher draining one EventQueue in the bench process "
                      "(RSS is the bench process, holding the queue)"}
    if bench is not None:
        bench.flusher_db = path
    count = enrich_only_events or max(BATCH_SIZE, events // 5)
    seconds, cpu, _ = drain(count, write=lambda conn, batch: None)
    result["enrich_only"] = {"events": count, "events_per_s": round(count / seconds),
                             "cpu_us_per_event": round(cpu * 1e6 / count, 1),
                             "what": "the same drain with the write replaced by nothing"}
    return result


# Results ------------------------------------------------------------------------------

TARGETS = (
    # (name, target text, figure key, comparison, threshold)
    ("single_vs_ceiling", "single events >= 90% of the bare-Falcon ceiling",
     "single_vs_ceiling", ">=", 0.90),
    ("batch_events_per_s", "batches >= 60,000 events/s persisted, zero 503",
     "batch_persisted_events_per_s", ">=", 60_000),
    ("batch_vs_raw_sqlite", "batches >= 60% of the raw SQLite insert rate",
     "batch_vs_raw_sqlite", ">=", 0.60),
    ("p99_at_80", "p99 <= 15 ms at 80% of the sustained batch rate", "batch_p99_ms_at_80", "<=", 15),
    ("rss", "worker RSS <= 64 MB (MiB) under batch load", "batch_peak_rss_mib", "<=", 64),
    ("cpu_per_event", "CPU per event in batches <= 20 us", "batch_cpu_us_per_event", "<=", 20),
    ("reports", "each report over 1,000,000 events < 1 s", "slowest_report_s", "<", 1.0),
)


def _ok(result: dict | None) -> dict | None:
    return result if result and result.get("status") == "ok" else None


def derived_figures(scenarios: dict) -> dict:
    """Ratios and the headline figures the targets compare, None where not measured."""
    ceiling, single = _ok(scenarios.get("ceiling")), _ok(scenarios.get("single"))
    batches, raw = _ok(scenarios.get("batches")), _ok(scenarios.get("sqlite"))
    reports = _ok(scenarios.get("reports"))
    sustained = (batches or {}).get("sustained") or {}
    at_80 = (batches or {}).get("at_80_percent") or {}
    figures: dict = {
        "single_vs_ceiling": None, "batch_persisted_events_per_s": None,
        "batch_vs_raw_sqlite": None, "batch_p99_ms_at_80": at_80.get("p99_ms"),
        "batch_peak_rss_mib": None, "batch_cpu_us_per_event": sustained.get("cpu_us_per_event"),
        "slowest_report_s": None,
    }
    if ceiling and single and ceiling.get("requests_per_s"):
        figures["single_vs_ceiling"] = round(single["requests_per_s"] / ceiling["requests_per_s"], 3)
    if sustained:
        figures["batch_persisted_events_per_s"] = sustained.get("persisted_events_per_s")
        rss = [*sustained.get("peak_rss_mib", []), *at_80.get("peak_rss_mib", [])]
        figures["batch_peak_rss_mib"] = max(rss) if rss else None
        if raw and raw.get("rows_per_s"):
            figures["batch_vs_raw_sqlite"] = round(
                sustained["persisted_events_per_s"] / raw["rows_per_s"], 3)
    if reports and reports.get("reports"):
        figures["slowest_report_s"] = max(r["seconds"] for r in reports["reports"])
    return figures


def targets(figures: dict) -> list[dict]:
    out = []
    for name, text, key, comparison, threshold in TARGETS:
        value = figures.get(key)
        met = None
        if value is not None:
            met = value >= threshold if comparison == ">=" else (
                value <= threshold if comparison == "<=" else value < threshold)
        out.append({"name": name, "target": text, "figure": value, "met": met})
    return out


def assemble(machine: dict, settings: dict, scenarios: dict, *, date: str | None = None) -> dict:
    figures = derived_figures(scenarios)
    return {
        "schema": RESULTS_SCHEMA,
        "date": date or dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "machine": machine,
        "settings": settings,
        "scenarios": scenarios,
        "figures": figures,
        "targets": targets(figures),
    }


def write_results(doc: dict, path: Path = RESULTS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    tmp.replace(path)
    return path


def _fmt(value, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and digits:
        return f"{value:,.{digits}f}"
    if isinstance(value, (int, float)):
        return f"{round(value):,}"
    return str(value)


def table_rows(doc: dict) -> list[list[str]]:
    """Scenario, req/s, events/s, p50 ms, p99 ms, CPU us/event, peak RSS MiB, note."""
    s = doc["scenarios"]
    rows = []

    def add(name, r, events_key="events_per_s", note=""):
        if r is None:
            return
        if r.get("status") != "ok":
            rows.append([name, "-", "-", "-", "-", "-", "-", f"{r.get('status')}: {r.get('reason', '')}"[:90]])
            return
        cpu = r.get("cpu_us_per_event", r.get("cpu_us_per_request"))
        rss = max(r["peak_rss_mib"]) if r.get("peak_rss_mib") else None
        rows.append([name, _fmt(r.get("requests_per_s")), _fmt(r.get(events_key)),
                     _fmt(r.get("p50_ms"), 2), _fmt(r.get("p99_ms"), 2), _fmt(cpu, 1),
                     _fmt(rss, 1), note])

    ceiling = s.get("ceiling")
    add("bare Falcon ceiling (POST 204)", ceiling, note="CPU per request")
    single = s.get("single")
    add("single events (~600 B, closed loop)", single, "events_per_s",
        f"{_fmt((single or {}).get('events_in_db'))} in db" if _ok(single) else "")
    batches = s.get("batches")
    if _ok(batches) and batches.get("sustained"):
        sus = {**batches["sustained"], "status": "ok"}
        add("50-event batches, highest sustained", sus, "persisted_events_per_s",
            f"offered {_fmt(sus['offered_events_per_s'])}/s, 0 x 503, persisted/s shown")
        at80 = {**batches["at_80_percent"], "status": "ok"}
        add("50-event batches at 80% of it", at80, "persisted_events_per_s",
            f"offered {_fmt(at80['offered_events_per_s'])}/s")
    elif batches is not None:
        add("50-event batches", batches if batches.get("status") != "ok"
            else {"status": "none sustained", "reason": "503 at the lowest rate"})
    payments = s.get("payments")
    add("payments upserts (closed loop)", payments, note="CPU per request" if _ok(payments) else "")
    raw = s.get("sqlite")
    if _ok(raw):
        rows.append(["raw SQLite insert, events schema", "-", _fmt(raw["rows_per_s"]), "-", "-",
                     "-", "-", f"{raw['transaction_rows']:,}-row transactions, {len(raw['indexes'])} index(es)"])
    elif raw is not None:
        add("raw SQLite insert, events schema", raw)
    flush = s.get("flusher")
    if _ok(flush):
        rows.append([f"flusher alone, {flush['events_queued']:,} queued", "-",
                     _fmt(flush["events_per_s"]), "-", "-", _fmt(flush["cpu_us_per_event"], 1),
                     _fmt(flush["peak_rss_mib"], 1), f"drained in {flush['seconds']} s"])
    elif flush is not None:
        add("flusher alone", flush)
    reports = s.get("reports")
    if _ok(reports):
        for r in reports["reports"]:
            rows.append([f"report {r['name']}", "-", "-", _fmt(r["seconds"] * 1000, 1), "-", "-",
                         "-", f"over {reports['events']:,} events"])
    elif reports is not None:
        add("reports", reports)
    return rows


HEADER = ["scenario", "req/s", "events/s", "p50 ms", "p99 ms", "CPU us/event", "RSS MiB", "note"]


def text_table(doc: dict) -> str:
    rows = [HEADER, *table_rows(doc)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
             for r in rows]
    lines += ["", "ratios: single/ceiling "
              f"{_fmt(doc['figures']['single_vs_ceiling'], 3)}, batch persisted/raw SQLite "
              f"{_fmt(doc['figures']['batch_vs_raw_sqlite'], 3)}", "targets:"]
    for t in doc["targets"]:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
        lines.append(f"  {t['target']}: {_fmt(t['figure'], 3) if isinstance(t['figure'], float) else _fmt(t['figure'])} ({verdict})")
    return "\n".join(lines)


def markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = [f"Measured {doc['date'][:10]} on {m['cores']} cores ({m['cpu_model']}), "
             f"{doc['settings']['workers']} sync workers, wrk on the same cores, load average "
             f"before the run {', '.join(map(str, m.get('loadavg_before', [])))}. "
             f"Raw figures: `bench/results/latest.json`.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(doc)]
    lines += ["", "| target | figure | met |", "|---|---|---|"]
    for t in doc["targets"]:
        verdict = {True: "yes", False: "no", None: "not measured"}[t["met"]]
        figure = _fmt(t["figure"], 3) if isinstance(t["figure"], float) else _fmt(t["figure"])
        lines.append(f"| {t['target']} | {figure} | {verdict} |")
    return "\n".join(lines)


def update_readme(doc: dict, path: Path = README) -> bool:
    """Replace the block between the bench markers of README's Performance section."""
    text = path.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        return False
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    path.write_text(f"{head}{README_START}\n{markdown(doc)}\n{README_END}{tail}", encoding="utf-8")
    return True


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
    scenarios: dict = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tally-bench-") as folder:
        bench = Bench(args.workers, load, Path(folder), quick=args.quick)
        if args.quick:
            bench.raw_rows, bench.flusher_events, bench.report_events = 100_000, 100_000, 100_000
        try:
            for name in SCENARIOS:
                if name in args.only:
                    if name == "flusher":
                        bench.close()  # the flusher runs alone, with no server using CPU
                    scenarios[name] = run_scenario(name, getattr(bench, name), log)
        finally:
            bench.close()
    machine["loadavg_after"] = _loadavg()
    settings["total_seconds"] = round(time.monotonic() - started, 1)
    doc = assemble(machine, settings, scenarios)
    write_results(doc, args.out)
    print(text_table(doc))
    print(f"\nwritten: {args.out}")
    if args.readme and update_readme(doc):
        print(f"updated: {README.relative_to(REPO)} (Performance)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
