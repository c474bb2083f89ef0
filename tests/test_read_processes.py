"""Reads over HTTP in read processes (storage/read_processes.py): under real gunicorn on
both backends, at their lower priority, one at a time per worker (the owner's first),
within the read budget (CPU on SQLite), replaced when one dies, gone with the server."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import orjson
import pytest

from app import create_app
from config import Config
from storage.db import ReadBudgetExceeded
from storage.read_processes import GRACE, ReadGate, ReadProcesses, ReadSlots
from storage.reads import ReadsBusy
from tests.conftest import WAIT, bearer, config_for, http, is_postgres, wait_until
from tests.test_read_budget import FOREVER

SERVE = "from storage.read_processes import serve"


# Reads the tests hand to the processes: module-level, called with the process's Database.
def count_forever(db):
    return db.conn().execute(FOREVER).fetchone()


def sleep_past_the_budget(db, seconds: float):
    time.sleep(seconds)


def whoami(db) -> tuple[int, int]:
    return os.getpid(), os.getpriority(os.PRIO_PROCESS, 0)


def parallel_workers(db) -> str:
    return db.conn().execute("SHOW max_parallel_workers_per_gather").fetchone()[0]


# Some 100,000 SQLite steps (a few ms of CPU), more than the budget's check interval the
# tests set: the budget is asked at least once while it runs.
SHORT = ("WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 20000)"
         " SELECT count(*) FROM c")


def idle_then_count(db, seconds: float):
    """`seconds` without CPU (as a read the machine starves), then a statement."""
    time.sleep(seconds)
    return db.conn().execute(SHORT).fetchone()[0]


def until_released(db, released: str, marks: str, mark: str) -> None:
    """Adds `mark` to the file `marks`, then holds its turn until the file `released` is
    there."""
    with open(marks, "a") as file:
        file.write(mark + "\n")
    deadline = time.monotonic() + WAIT
    while not os.path.exists(released) and time.monotonic() < deadline:
        time.sleep(0.01)


def nice_in_stat(pid: int) -> int:
    """The nice value the kernel schedules `pid` at: /proc/<pid>/stat's 19th field."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


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
    # On SQLite the budget is the read's CPU: on a busy machine a read at nice +10 may take
    # far longer than `longest` (30 s) to use 2 s of it, and would be answered 503 instead
    # (the next test); here it is given the suite's wait.
    reads = ReadProcesses(config_for(db_path, read_budget=2.0), 2.0, preload=(__name__,),
                          longest=WAIT)
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
    # On SQLite the budget is CPU, so a process silent for `longest` is killed whatever it
    # is doing (503: retry); on PostgreSQL it is time (422: too expensive).
    reads = ReadProcesses(config_for(db_path, read_budget=2.0), 2.0, preload=(__name__,),
                          longest=2.0 + GRACE)
    bound = reads.longest
    try:
        # The reads around the silent one may wait longer for a niced process's turn on a
        # loaded machine (a 4 s bound answered the first `whoami` busy there).
        reads.longest = WAIT
        first, _ = reads.call(whoami)
        silent = ReadBudgetExceeded if is_postgres(db_path) else ReadsBusy
        reads.longest = bound
        with pytest.raises(silent):  # Python work no statement budget stops
            reads.call(sleep_past_the_budget, 2.0 + GRACE + 30)
        reads.longest = WAIT
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


def test_on_sqlite_the_budget_counts_the_reads_cpu_not_the_time_it_waited_for_it(db_path):
    """A read idle past its budget (as one starved of CPU by ingestion and other work) is
    answered on SQLite, where its statements run in the read process and the budget is
    their CPU; on PostgreSQL the server runs them and the budget is time."""
    config = config_for(db_path, read_budget=0.5, read_budget_check_steps=100)
    reads = ReadProcesses(config, 0.5, preload=(__name__,))
    try:
        if is_postgres(db_path):
            with pytest.raises(ReadBudgetExceeded):
                reads.call(idle_then_count, 1.0)
            assert reads.call(parallel_workers) == "0"  # one backend per read
        else:
            assert reads.call(idle_then_count, 1.0) == 20000
            with pytest.raises(ReadBudgetExceeded):  # CPU past the budget is stopped
                reads.call(count_forever)
    finally:
        reads.stop()


def test_one_read_at_a_time_the_owners_first_and_a_read_kept_waiting_is_busy(
        db_path, tmp_path):
    gate = ReadGate()
    config = config_for(db_path)
    owners = ReadProcesses(config, None, preload=(__name__,), gate=gate, first=True)
    viewers = ReadProcesses(config, None, preload=(__name__,), gate=gate, first=False,
                            wait=30)
    impatient = ReadProcesses(config, None, preload=(__name__,), gate=gate, first=True,
                              wait=0.05)
    released, marks = tmp_path / "released", tmp_path / "marks"
    failures: list[BaseException] = []

    def read(reads: ReadProcesses, mark: str) -> threading.Thread:
        def run():
            try:
                reads.call(until_released, str(released), str(marks), mark)
            except BaseException as exc:  # the test's thread reports it
                failures.append(exc)
        thread = threading.Thread(target=run)
        thread.start()
        return thread

    def marked() -> list[str]:
        return marks.read_text().split() if marks.exists() else []

    try:
        threads = [read(owners, "running")]
        assert wait_until(lambda: marked() == ["running"])
        with pytest.raises(ReadsBusy):  # its wait is over while the other holds the turn
            impatient.call(whoami)
        threads.append(read(viewers, "viewer"))
        assert wait_until(lambda: gate.state() == (True, 1))
        threads.append(read(owners, "owner"))
        assert wait_until(lambda: gate.state() == (True, 2))
        assert marked() == ["running"]  # neither runs beside the first
        released.touch()
        for thread in threads:
            thread.join(WAIT)
        assert not failures
        assert marked() == ["running", "owner", "viewer"]  # the owner's went first
        assert gate.state() == (False, 0)
    finally:
        released.touch()
        for reads in (owners, viewers, impatient):
            reads.stop()


def test_reads_of_several_workers_share_the_machines_slots(db_path, tmp_path):
    """Two workers' gates over one slot: a read of one waits for the other's to end, and
    is answered ReadsBusy when its wait is over first."""
    slots = ReadSlots(db_path, 1, folder=str(tmp_path))
    config = config_for(db_path)
    one = ReadProcesses(config, None, preload=(__name__,), gate=ReadGate(slots))
    other = ReadProcesses(config, None, preload=(__name__,), gate=ReadGate(slots), wait=30)
    impatient = ReadProcesses(config, None, preload=(__name__,), gate=ReadGate(slots),
                              wait=0.05)
    released, marks = tmp_path / "released", tmp_path / "marks"
    answered: list = []
    try:
        first = threading.Thread(target=lambda: answered.append(one.call(
            until_released, str(released), str(marks), "one")))
        first.start()
        assert wait_until(lambda: marks.exists() and marks.read_text().split() == ["one"])
        with pytest.raises(ReadsBusy):
            impatient.call(whoami)
        second = threading.Thread(target=lambda: answered.append(other.call(whoami)))
        second.start()
        assert wait_until(lambda: other.gate.state() == (True, 0))  # it holds its worker's
        assert answered == []  # but not the machine's slot
        released.touch()
        for thread in (first, second):
            thread.join(WAIT)
        assert len(answered) == 2 and None in answered  # until_released answers None
    finally:
        released.touch()
        for reads in (one, other, impatient):
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
    for pid in processes:  # the kernel runs them at the lower priority
        assert nice_in_stat(pid) == Config().read_nice

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
