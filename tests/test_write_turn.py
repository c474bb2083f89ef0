"""SQLite's write turn (storage.db.WRITE_TURN_SUFFIX): Tally's writers in every process take
an exclusive flock beside the database before BEGIN IMMEDIATE and wait for it in the
kernel, so a waiting writer is woken when the turn is given back instead of polling; a
killed holder does not block, the busy timeout still ends in SQLite's own "database is
locked" (StorageBusy, a 503 on the request path), and no lock file leaves the writers
polling as before.

Real processes and a real file; SQLite only (PostgreSQL's writers take its own locks).
"""

from __future__ import annotations

import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from storage.db import WRITE_TURN_SUFFIX, Database, StorageBusy, StorageError
from tests.conftest import WAIT, wait_until

REPO = Path(__file__).resolve().parent.parent

# A Tally writer in a process of its own: takes its turn and SQLite's lock (a transaction
# of Database.connect's connection), says so, and commits its row when told (a line on
# stdin), or holds them until killed.
HOLDER = """
import sys
from storage.db import Database

db = Database(sys.argv[1])
conn = db.connect()
with db.transaction(conn):
    conn.execute("INSERT INTO turns(who) VALUES ('holder')")
    print("holding", flush=True)
    sys.stdin.readline()
print("committed", flush=True)
"""

# Holds the turn only (a flock on the turn's file), as a writer between its turn and its
# BEGIN would; SQLite's lock stays free.
TURN_ONLY = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("holding", flush=True)
sys.stdin.readline()
"""


def make_table(path: str) -> Database:
    db = Database(path)
    conn = db.connect()
    conn.execute("CREATE TABLE IF NOT EXISTS turns (who TEXT NOT NULL)")
    conn.close()
    return db


def start(script: str, *args: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO,
                               env={**os.environ, "PYTHONPATH": str(REPO)},
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert line.strip() == "holding", (line, process.wait(timeout=WAIT))
    return process


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=WAIT)


def blocked_on(path: str, pid: int) -> bool:
    """Whether a flock request of process `pid` on `path` waits in the kernel
    (/proc/locks lists waiting requests with '->')."""
    stat = os.stat(path)
    inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and "FLOCK" in fields:
            rest = fields[fields.index("->") + 1:]
            if rest[3] == str(pid) and rest[4] == inode:
                return True
    return False


def who(path: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT who FROM turns ORDER BY rowid")]
    finally:
        conn.close()


def test_a_writer_waits_in_the_kernel_for_another_process_and_is_handed_the_turn(tmp_path):
    path = str(tmp_path / "tally.db")
    db = make_table(path)
    holder = start(HOLDER, path)
    try:
        conn = db.connect()
        done = threading.Event()

        def write() -> None:
            with db.transaction(conn):
                conn.execute("INSERT INTO turns(who) VALUES ('waiter')")
            done.set()

        thread = threading.Thread(target=write)
        thread.start()
        # The waiter sleeps on the turn's flock (old code: it polled SQLite's lock).
        assert wait_until(lambda: blocked_on(path + WRITE_TURN_SUFFIX, os.getpid()), timeout=WAIT)
        assert not done.is_set()
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "committed"
        thread.join(WAIT)
        assert done.is_set()
        conn.close()
    finally:
        stop(holder)
    assert who(path) == ["holder", "waiter"]  # serialized: the holder's commit came first


def test_the_turn_is_given_back_after_each_transaction_and_on_failures(tmp_path):
    path = str(tmp_path / "tally.db")
    db = make_table(path)
    first, second = db.connect(), db.connect()
    with db.transaction(first):
        first.execute("INSERT INTO turns(who) VALUES ('one')")
    with pytest.raises(StorageError), db.transaction(second):
        second.execute("INSERT INTO no_such_table VALUES (1)")
    assert not second.write_turn.held
    with db.transaction(second):
        second.execute("INSERT INTO turns(who) VALUES ('two')")
    assert not first.write_turn.held and not second.write_turn.held
    assert free(path + WRITE_TURN_SUFFIX)
    first.close()
    second.close()
    assert who(path) == ["one", "two"]


def test_a_killed_holder_does_not_block_and_its_transaction_is_gone(tmp_path):
    path = str(tmp_path / "tally.db")
    db = make_table(path)
    holder = start(HOLDER, path)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=WAIT)
    assert free(path + WRITE_TURN_SUFFIX)  # the file stays; its lock went with the process
    conn = db.connect()
    with db.transaction(conn):
        conn.execute("INSERT INTO turns(who) VALUES ('after')")
    conn.close()
    # Restarted on the data: a new Database reads what was committed, nothing of the killed one.
    again = Database(path)
    conn = again.connect()
    assert [r[0] for r in conn.execute("SELECT who FROM turns")] == ["after"]
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


@pytest.mark.parametrize("holder_script", [HOLDER, None], ids=["tally-writer", "plain-sqlite"])
def test_the_busy_timeout_still_ends_in_sqlites_database_is_locked(tmp_path, holder_script):
    path = str(tmp_path / "tally.db")
    make_table(path)
    if holder_script is None:  # a writer outside Tally: SQLite's lock only, no turn
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
    else:
        holder = start(holder_script, path)
    try:
        impatient = Database(path, busy_timeout_ms=200)
        conn = impatient.connect()
        with pytest.raises(StorageBusy) as raised, impatient.transaction(conn):
            conn.execute("INSERT INTO turns(who) VALUES ('late')")
        assert str(raised.value) == "database is locked"
        assert not conn.write_turn.held
        conn.close()
    finally:
        if holder_script is None:
            other.execute("ROLLBACK")
            other.close()
        else:
            stop(holder)
    assert "late" not in who(path)


def test_a_turn_held_without_sqlites_lock_delays_to_the_deadline_and_never_refuses(tmp_path):
    path = str(tmp_path / "tally.db")
    make_table(path)
    stuck = start(TURN_ONLY, path + WRITE_TURN_SUFFIX)
    try:
        db = Database(path, busy_timeout_ms=200)
        conn = db.connect()
        waits = []
        for n in range(2):
            with db.transaction(conn):
                conn.execute("INSERT INTO turns(who) VALUES (?)", (f"w{n}",))
            waits.append(conn.write_turn.pending)
        # The wait given up stays queued and is taken up again: one waiting thread.
        assert waits[0] is not None and waits[0] is waits[1]
        conn.close()
    finally:
        stop(stuck)
    assert who(path) == ["w0", "w1"]
    # The given-up waits took the turn when it came and gave it back: it is free.
    assert wait_until(lambda: free(path + WRITE_TURN_SUFFIX), timeout=WAIT)


def free(path: str) -> bool:
    """Whether the turn can be taken now (through a descriptor of its own)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_no_turn_file_to_open_leaves_the_writers_on_sqlites_lock(tmp_path):
    path = str(tmp_path / "tally.db")
    db = make_table(path)
    # The turn's file cannot be made (as in a folder Tally may not write).
    os.symlink(tmp_path / "missing" / "turn", path + WRITE_TURN_SUFFIX)
    conn = db.connect()
    with db.transaction(conn):
        conn.execute("INSERT INTO turns(who) VALUES ('polled')")
    assert not conn.write_turn.held
    conn.close()
    assert who(path) == ["polled"]


def test_threads_of_one_process_take_turns_too(tmp_path):
    path = str(tmp_path / "tally.db")
    db = make_table(path)
    holding, writers = db.connect(), [db.connect() for _ in range(3)]
    finished = []
    with db.transaction(holding):
        holding.execute("INSERT INTO turns(who) VALUES ('first')")

        def write(conn, name):
            with db.transaction(conn):
                conn.execute("INSERT INTO turns(who) VALUES (?)", (name,))
            finished.append(name)

        threads = [threading.Thread(target=write, args=(conn, f"t{n}"))
                   for n, conn in enumerate(writers)]
        for thread in threads:
            thread.start()
        assert wait_until(lambda: sum(blocked_on_any(path + WRITE_TURN_SUFFIX)) >= 1, timeout=WAIT)
        assert finished == []
    for thread in threads:
        thread.join(WAIT)
    assert sorted(finished) == ["t0", "t1", "t2"]
    assert who(path)[0] == "first"
    for conn in (holding, *writers):
        conn.close()


def blocked_on_any(path: str) -> list[int]:
    """1 for each flock request waiting in the kernel on `path`."""
    stat = os.stat(path)
    inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    return [1 for line in Path("/proc/locks").read_text().splitlines()
            if "->" in line and "FLOCK" in line and line.split()[-3] == inode]
