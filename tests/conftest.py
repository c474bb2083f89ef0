"""Shared fixtures: a real SQLite file in a temp folder, an injectable clock, real processes."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import webtest
from hypothesis import settings

from app import create_app
from config import Config

# make test runs every property test with fixed examples and no deadline, so a shared,
# noisy machine can neither turn up a new example nor time one out; make fuzz
# (FUZZ_EXAMPLES) runs them at random.
settings.register_profile("fixed", derandomize=True, deadline=None, database=None)
settings.register_profile("fuzz", deadline=None)
settings.load_profile("fuzz" if os.environ.get("FUZZ_EXAMPLES") else "fixed")

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


class FakeClock:
    """A settable wall clock, injected wherever the code asks for time."""

    def __init__(self, start: float = 1_790_000_000.0):  # 2026-09-21T14:13:20Z
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def set(self, when: float) -> None:
        self.now = when


def counting_bytes():
    """Deterministic stand-in for secrets.token_bytes."""
    state = {"n": 0}

    def random_bytes(n: int) -> bytes:
        state["n"] += 1
        seed = state["n"].to_bytes(8, "big")
        return (seed * (n // 8 + 1))[:n]

    return random_bytes


@pytest.fixture
def db_path(tmp_path) -> str:
    return str(tmp_path / "tally.db")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def config(db_path) -> Config:
    return Config(db_path=db_path)


@pytest.fixture
def tally(config, clock):
    app = create_app(config, clock=clock)
    yield app
    app.stop(timeout=5)


@pytest.fixture
def client(tally) -> webtest.TestApp:
    return webtest.TestApp(tally)


@pytest.fixture
def directory(tally):
    return tally.directory


@pytest.fixture
def site(directory):
    """An account on the free plan with one site on example.com and a key of every scope."""
    account = directory.create_account("Example", "free")
    site = directory.create_site(account["id"], ["example.com", "www.example.com"])
    key = directory.create_key(site["id"], ["events", "payments", "read"])
    return {"account": account, "site": site, "key": key["key"], "key_id": key["id"]}


def bearer(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"}


def run_cli(*args: str, db: str, check: bool = True, env: dict | None = None,
            input_text: str | None = None):
    """The real `tally` console script, as an outside user runs it (stdin: input_text)."""
    full_env = {**os.environ, "TALLY_DB": db, **(env or {})}
    proc = subprocess.run([str(BIN / "tally"), *args], capture_output=True, text=True,
                          env=full_env, cwd=REPO, timeout=60, input=input_text or "")
    if check and proc.returncode != 0:
        raise AssertionError(f"tally {' '.join(args)} failed: {proc.stderr}")
    return proc


def cli_json(*args: str, db: str, env: dict | None = None) -> dict:
    return orjson.loads(run_cli(*args, "--json", db=db, env=env).stdout)


def rows(db_path: str, sql: str, params=()) -> list[dict]:
    """Read what is on disk through a connection of the test's own."""
    conn = sqlite3.connect(db_path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, params)]
    finally:
        conn.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A real gunicorn serving app:app from the repo root, with gunicorn.conf.py."""

    def __init__(self, db: str, workers: int = 2, env: dict | None = None,
                 log_path: Path | None = None, app: str = "app:app"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = db
        self.log_path = log_path or Path(db).with_suffix(".log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(BIN / "gunicorn"), "--bind", f"127.0.0.1:{self.port}", "--workers", str(workers),
             app],
            cwd=REPO, env={**os.environ, "TALLY_DB": db, **(env or {})},
            stdout=self._log, stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 30) -> Server:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"gunicorn exited: {self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"gunicorn not ready: {self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def server_factory(tmp_path):
    servers = []

    def start(db: str, workers: int = 2, env: dict | None = None, app: str = "app:app") -> Server:
        server = Server(db, workers, env, app=app).wait_ready()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None):
    """One plain HTTP request; returns (status, case-insensitive headers, body bytes)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()

