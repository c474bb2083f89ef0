"""What the benchmark reads and drives: the machine, worker processes through /proc,
gunicorn services, wrk, and the database it counts events in (a SQLite file or a
database of a PostgreSQL server)."""

from __future__ import annotations

import contextlib
import errno
import importlib.metadata
import os
import platform
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import orjson

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LUA = REPO / "bench" / "lua" / "post.lua"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class WrkMissing(RuntimeError):
    """wrk is not installed."""


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
        "loadavg_before": loadavg(),
    }


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def loadavg() -> list[float]:
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
    """Children of any of the process's threads (a read process is a request thread's)."""
    found = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                found += [int(x) for x in (task / "children").read_text().split()]
            except OSError:
                continue
    except OSError:
        return []
    return found


def cpu_seconds(pid: int, thread: int | None = None) -> float | None:
    """User plus system CPU of a process (all its threads, exited ones included), or of
    one of its threads."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        stat = Path(path).read_text()
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


# The name Tally's worker gives the OS threads that serve requests (serving/worker.py).
REQUEST_THREAD_NAME = "tally-request"


def request_threads_cpu_seconds(pid: int) -> float:
    """CPU of the threads of a worker that take requests in: its main thread (a sync
    worker's requests, or gthread's poller, which accepts connections) and the threads
    named REQUEST_THREAD_NAME (gthread's pool). The flush thread and the payment writer
    are the rest of the process."""
    total = 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        if int(tid) == pid or name == REQUEST_THREAD_NAME:
            total += cpu_seconds(pid, int(tid)) or 0.0
    return total


@dataclass
class WorkerProbe:
    """CPU seconds and peak RSS of a set of worker processes over one scenario."""

    pids: list[int]
    cpu_before: dict[int, tuple[float, float]] = field(default_factory=dict)
    rss_reset: bool = False

    def start(self) -> WorkerProbe:
        self.rss_reset = all([reset_peak_rss(pid) for pid in self.pids])
        self.cpu_before = {pid: self._cpu(pid) for pid in self.pids}
        return self

    @staticmethod
    def _cpu(pid: int) -> tuple[float, float]:
        """(whole process, the threads that take requests in)."""
        return cpu_seconds(pid) or 0.0, request_threads_cpu_seconds(pid)

    def finish(self) -> dict:
        total = requests = 0.0
        for pid, (total_before, requests_before) in self.cpu_before.items():
            if cpu_seconds(pid) is None:
                continue  # the worker is gone (restarted): its time is lost
            total_after, requests_after = self._cpu(pid)
            total += total_after - total_before
            requests += requests_after - requests_before
        rss = [peak_rss_mib(pid) for pid in self.pids]
        return {"cpu_s": round(total, 3), "request_thread_cpu_s": round(requests, 3),
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
                 env: dict | None = None, *, own_session: bool = False):
        """`own_session`: gunicorn in a session of its own, as under systemd (with the
        kernel's autogroup, its processes then share one scheduling group of their own)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(BIN / "gunicorn"), "-c", str(conf), "--bind", f"127.0.0.1:{self.port}",
             "--workers", str(workers), app_spec],
            cwd=REPO, env={**os.environ, **(env or {})},
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=own_session,
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
        """The workers and their children (the read processes), whose CPU is the server's."""
        workers = children(self.proc.pid)
        return workers + [pid for worker in workers for pid in children(worker)]

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
            key: str | None = None, headers: dict | None = None) -> dict:
    """One wrk run; the figures of bench/lua/post.lua's WRK_JSON line. `headers`: only
    User-Agent and Content-Type are passed on."""
    headers = headers or {}
    env = {**os.environ, "BENCH_BODIES": str(bodies), "BENCH_THREADS": str(load.threads),
           "BENCH_RATE": f"{rate_rps:.3f}", "BENCH_KEY": key or "",
           "BENCH_UA": headers.get("User-Agent", ""),
           "BENCH_CONTENT_TYPE": headers.get("Content-Type", "")}
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


# Database -----------------------------------------------------------------------------
# A bench database is a target: a SQLite file's path, or a postgresql:// URL.


def is_postgres(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def database_env(target: str) -> dict:
    """The TALLY_ variables that point the service and the CLI at `target` (an empty
    TALLY_DATABASE_URL leaves Tally on the SQLite file, whatever the caller's environment)."""
    if is_postgres(target):
        return {"TALLY_DATABASE_URL": target}
    return {"TALLY_DB": target, "TALLY_DATABASE_URL": ""}


def open_target(target: str):
    """storage's Database (SQLite) or PostgresDatabase for `target`."""
    from config import Config
    from storage.backend import open_database

    if is_postgres(target):
        return open_database(Config(database_url=target))
    return open_database(Config(db_path=target))


def _scalar(target: str, query: str) -> int:
    if is_postgres(target):
        import psycopg

        with psycopg.connect(target, autocommit=True, connect_timeout=30) as conn:
            return conn.execute(query).fetchone()[0]
    conn = sqlite3.connect(f"file:{target}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(query).fetchone()[0]
    finally:
        conn.close()


def table_count(target: str, table: str) -> int:
    return _scalar(target, f"SELECT count(*) FROM {table}")  # noqa: S608 - table is events or payments, fixed here


def max_event_id(target: str) -> int:
    """Cheap stand-in for count(*) while load runs: ids rise with each commit (the flush
    holds the one writer lock) and nothing is deleted."""
    return _scalar(target, "SELECT coalesce(max(id), 0) FROM events")


def events_bytes(target: str) -> int | None:
    """The bytes the events table takes with its indexes (None where it cannot be read)."""
    if is_postgres(target):
        # events is partitioned by month: the parent itself holds nothing.
        return _scalar(target, "SELECT sum(pg_total_relation_size(relid))::bigint"
                               " FROM pg_partition_tree('events')")
    try:  # SQLite's dbstat table, when compiled in
        return _scalar(target, "SELECT sum(pgsize) FROM dbstat"
                               " WHERE name IN ('events', 'events_site_ts')")
    except sqlite3.Error:
        return None


@contextlib.contextmanager
def postgres_database(server_url: str, prefix: str):
    """The URL of a new, empty database on the server at `server_url` (its role may create
    databases), dropped afterwards with any connection still open to it. A database of its
    own, not a schema: DatabaseProbe finds its server processes by its name."""
    import psycopg

    name = f"{prefix}_{os.urandom(6).hex()}"
    with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # sql-safe: prefix is the caller's, then hex
    try:
        yield urlsplit(server_url)._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')  # sql-safe: as created above


class CpuWeightUnavailable(RuntimeError):
    """This machine cannot put the database server in a CPU group (the message says why)."""


def _postmaster_pid(server_url: str) -> int:
    import psycopg

    with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        try:  # while the backend lives: it ends with the connection
            stat = Path(f"/proc/{backend}/stat").read_text()
        except OSError:
            raise CpuWeightUnavailable(
                "the PostgreSQL server is not a process of this machine") from None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _cpu_cgroup_root() -> tuple[Path, str]:
    """The CPU controller's hierarchy and its weight file (cgroup v2's cpu.weight, 1-10000,
    is systemd's CPUWeight; v1's cpu.shares is 1024 for a weight of 100)."""
    unified = Path("/sys/fs/cgroup")
    subtree = unified / "cgroup.subtree_control"
    if subtree.exists() and "cpu" in subtree.read_text().split():
        return unified, "cpu.weight"
    if (unified / "cpu" / "cpu.shares").exists():
        return unified / "cpu", "cpu.shares"
    raise CpuWeightUnavailable("no cgroup CPU controller is mounted")


@contextlib.contextmanager
def postgres_cpu_weight(server_url: str, weight: int, wait: float = 600.0):
    """The PostgreSQL server (its postmaster and every process of it, so also the backends
    it starts meanwhile) in a CPU group of `weight` (systemd's CPUWeight; others have 100),
    as `CPUWeight=` in a drop-in for postgresql@.service does (docs/deploy/systemd); moved
    back where it was on leaving. Needs root and a local server. One run at a time on the
    machine (a lock file): two would move the one server between their groups."""
    import fcntl

    if os.geteuid() != 0:
        raise CpuWeightUnavailable("moving the server into a CPU group needs root")
    root, weight_file = _cpu_cgroup_root()
    postmaster = _postmaster_pid(server_url)
    with open(Path(tempfile.gettempdir()) / "tally-bench-postgres-cpu.lock", "w") as lock:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CpuWeightUnavailable(
                        f"another run kept the server in its CPU group for {wait:g} s") from None
                time.sleep(0.1)
        with _cpu_group(root, weight_file, weight, postmaster) as group:
            yield group


def _cpu_group_of(pid: int, weight_file: str) -> str:
    """The process's group in the CPU hierarchy ("/" for the root)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (weight_file == "cpu.weight" and controllers == "") or "cpu" in controllers.split(","):
            return path
    return "/"


@contextlib.contextmanager
def _cpu_group(root: Path, weight_file: str, weight: int, postmaster: int):
    home = root / _cpu_group_of(postmaster, weight_file).lstrip("/")
    group = root / f"tally-bench-postgres-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as exc:
        raise CpuWeightUnavailable(f"cannot make a CPU group: {exc}") from None
    try:
        (group / weight_file).write_text(
            str(weight if weight_file == "cpu.weight" else weight * 1024 // 100))
        for pid in (postmaster, *children(postmaster)):
            try:
                (group / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:
                continue  # a backend that ended meanwhile
        yield group
    finally:
        _empty_and_remove(group, home)


def _empty_and_remove(group: Path, home: Path, wait: float = 30.0) -> None:
    """Move what is left in `group` back `home`, then remove it. A backend forked while
    moving lands in the group too, and one that has ended stays in it (and cannot be moved)
    until the postmaster reaps it, so the removal is tried again until the group is empty."""
    deadline = time.monotonic() + wait
    while True:
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (home / "cgroup.procs").write_text(pid)
            except ProcessLookupError:
                continue  # ended: leaves the group once reaped
        try:
            group.rmdir()
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        time.sleep(0.01)


class DatabaseProbe:
    """CPU seconds of the PostgreSQL server processes serving one bench database over a
    scenario (the server runs on this machine: its backends' /proc/<pid>/stat). A backend
    that starts during the scenario counts from zero; one that ends is lost. For a SQLite
    target there is no server: the figure is None, the work is in the workers' CPU."""

    def __init__(self, target: str):
        self.target = target
        self.before: dict[int, float] = {}

    def _pids(self) -> list[int]:
        if not is_postgres(self.target):
            return []
        import psycopg

        with psycopg.connect(self.target, autocommit=True, connect_timeout=10) as conn:
            return [row[0] for row in conn.execute(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()")]

    def start(self) -> DatabaseProbe:
        self.before = {pid: cpu_seconds(pid) or 0.0 for pid in self._pids()}
        return self

    def finish(self) -> float | None:
        if not is_postgres(self.target):
            return None
        total = 0.0
        for pid in self._pids():
            now = cpu_seconds(pid)
            if now is not None:
                total += now - self.before.get(pid, 0.0)
        return round(total, 3)


class PersistWatch:
    """Samples the newest event id while load runs, to date when the last event landed."""

    def __init__(self, db_path: str, period: float = 0.25):
        self.db_path = db_path  # a target: SQLite path or PostgreSQL URL
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
            with contextlib.suppress(Exception):  # a sample missed is taken next period
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



