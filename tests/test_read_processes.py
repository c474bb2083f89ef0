"""Reads over HTTP in read processes (storage/read_processes.py): under real gunicorn on
both backends, within the read budget, replaced when one dies, gone with the server."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import orjson
import pytest

from app import create_app
from storage.db import ReadBudgetExceeded
from storage.read_processes import GRACE, ReadProcesses
from storage.reads import ReadsBusy
from tests.conftest import bearer, config_for, http, is_postgres, wait_until
from tests.test_read_budget import FOREVER

SERVE = "from storage.read_processes import serve"


# Reads the tests hand to the processes: module-level, called with the process's Database.
def count_forever(db):
    return db.conn().execute(FOREVER).fetchone()


def sleep_past_the_budget(db, seconds: float):
    time.sleep(seconds)


def whoami(db) -> tuple[int, int]:
    return os.getpid(), os.getpriority(os.PRIO_PROCESS, 0)


def read_processes(parents: list[int] | None = None) -> dict[int, int]:
    """pid -> parent pid of every read process (of `parents` only, when given)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if SERVE in command and (parents is None or parent in parents):
            found[int(entry.name)] = parent
    return found


def children(pid: int) -> list[int]:
    return [p for p, parent in _parents().items() if parent == pid]


def _parents() -> dict[int, int]:
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                table[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return table


def gone(pids) -> bool:
    return not any(Path(f"/proc/{pid}").exists() and _running(pid) for pid in pids)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_read_past_its_budget_is_stopped_in_its_process_which_serves_the_next(db_path):
    reads = ReadProcesses(config_for(db_path, read_budget=2.0), 2.0, preload=(__name__,))
    try:
        pid, nice = reads.call(whoami)
        assert nice >= 10  # the kernel prefers the worker's threads
        with pytest.raises(ReadBudgetExceeded):
            reads.call(count_forever)
        # The process stopped its own statement and answered: the same one serves on.
        assert reads.call(whoami)[0] == pid
        if is_postgres(db_path):
            import psycopg

            with psycopg.connect(db_path, autocommit=True) as conn:
                assert not conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE strpos(query, %s) = 1"
                    " AND state = 'active'", ("WITH RECURSIVE c(n)",)).fetchone()[0]
    finally:
        reads.stop()
    assert wait_until(lambda: gone([pid]))


def test_a_process_that_does_not_answer_is_killed_and_a_dead_one_replaced(db_path):
    reads = ReadProcesses(config_for(db_path, read_budget=2.0), 2.0, preload=(__name__,))
    try:
        first, _ = reads.call(whoami)
        with pytest.raises(ReadBudgetExceeded):  # Python work no statement budget stops
            reads.call(sleep_past_the_budget, 2.0 + GRACE + 30)
        assert wait_until(lambda: gone([first]))
        second, _ = reads.call(whoami)
        assert second != first
        os.kill(second, signal.SIGKILL)
        assert wait_until(lambda: gone([second]))
        with pytest.raises(ReadsBusy):  # answered 503: retry
            reads.call(whoami)
        third, _ = reads.call(whoami)
        assert third not in (first, second)
    finally:
        reads.stop()


def _site(db: str) -> tuple[str, str]:
    tally = create_app(config_for(db))
    try:
        account = tally.directory.create_account("Reads", "scale")
        site = tally.directory.create_site(account["id"], ["reads.example"])
        return site["id"], tally.directory.create_key(site["id"], ["read", "events"])["key"]
    finally:
        tally.stop(timeout=5)


def _visitors(server, key: str):
    status, _, body = http("GET", server.url + "/api/v1/stats/aggregate",
                           headers=bearer(key))
    return status, orjson.loads(body)


def test_reads_under_gunicorn_run_in_read_processes_that_go_with_the_server(
        db_path, server_factory):
    site_id, key = _site(db_path)
    server = server_factory(db_path)
    event = orjson.dumps({"s": site_id, "e": "pageview", "u": "https://reads.example/a"})
    status, _, _ = http("POST", server.url + "/api/v1/events", event,
                        {**bearer(key), "Content-Type": "application/json"})
    assert status == 204
    assert wait_until(lambda: _visitors(server, key)[1].get("data", {}).get("pageviews") == 1)
    status, _, body = http("GET", server.url + "/api/v1/stats/aggregate?filters=bogus",
                           headers=bearer(key))  # the process's exception, answered as here
    assert status == 400 and orjson.loads(body)["error"]["code"] == "invalid_input"
    workers = children(server.proc.pid)
    processes = read_processes(workers)
    assert processes  # the read was answered by one, a child of a worker

    killed = next(iter(processes))
    os.kill(killed, signal.SIGKILL)
    assert wait_until(lambda: gone([killed]))
    # A read that meets the dead process is answered 503; one after it is served again.
    assert wait_until(lambda: _visitors(server, key)[0] == 200
                      and killed not in read_processes(workers)
                      and len(read_processes(workers)) >= 1)
    for _ in range(4):  # every worker's read process, old or new, serves
        status, answer = _visitors(server, key)
        assert status in (200, 503)
        if status == 200:
            assert answer["data"]["pageviews"] == 1

    server.proc.send_signal(signal.SIGKILL)  # the master, with no time to clean up
    server.proc.wait()
    everything = set(read_processes(workers)) | set(workers)
    assert wait_until(lambda: gone(everything))

    restarted = server_factory(db_path)  # on the same data
    assert wait_until(lambda: _visitors(restarted, key)[1].get("data", {}).get("pageviews") == 1)
    again = read_processes(children(restarted.proc.pid))
    assert again and not set(again) & everything
    restarted.stop()
    assert wait_until(lambda: gone(again))
