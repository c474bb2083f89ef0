"""A real streaming replica of the test PostgreSQL server, for the tests of reads from one.

`streaming_replica(primary_url)` copies the test server with pg_basebackup into a new
folder and starts it, as the `postgres` user, on a free port of 127.0.0.1 as a hot
standby streaming from the test server; it is stopped and its folder removed on leaving.

What the test server needs: wal_level `replica` (PostgreSQL's default), a free WAL sender
(max_wal_senders) and a pg_hba.conf entry that lets 127.0.0.1 connect for replication.
The project's test server trusts 127.0.0.1 for every database but has no `replication`
entry, so `allow_replication` adds `host replication all 127.0.0.1/32 trust` (no more than
what the server already grants 127.0.0.1: a superuser login without a password) and
reloads the configuration; no restart is needed. Changing wal_level or max_wal_senders
would need one, so a server without them is reported, not changed.

The replica streams through a physical replication slot of its own, so the primary keeps
every WAL segment the replica has not received. Without one, a replica stopped while the
rest of the suite writes finds, on its start, that a checkpoint has recycled the segment
it needs ("requested WAL segment ... has already been removed") and never catches up.
The slot is dropped on leaving; a slot left by a test process that died is dropped by
the next replica made, since a forgotten slot holds WAL on the test server for good.
A test process killed before its cleanup ran (a `timeout`, a SIGKILL) also leaves its
replica running; its folder is named after the process, so the next replica made stops
and removes those whose process is gone, and then their slots can be dropped.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from tests.conftest import WAIT, free_port, wait_until

REPLICATION_RULE = "host replication all 127.0.0.1/32 trust"
# Settings a hot standby must hold at least at the primary's values.
STANDBY_MINIMUMS = ("max_connections", "max_worker_processes", "max_wal_senders",
                    "max_prepared_transactions", "max_locks_per_transaction")


class ReplicaUnavailable(Exception):
    """This machine cannot make a replica of the test server (the message says why)."""


def _admin(primary_url: str) -> psycopg.Connection:
    parts = urlsplit(primary_url)
    return psycopg.connect(urlunsplit(parts._replace(query="")), autocommit=True,
                           connect_timeout=5)


def _bindir() -> str:
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                             check=True).stdout.strip()
        if os.path.exists(os.path.join(out, "pg_ctl")):
            return out
    except (OSError, subprocess.CalledProcessError):
        pass
    found = shutil.which("pg_ctl")
    if found is None:
        raise ReplicaUnavailable("pg_ctl is not installed")
    return os.path.dirname(os.path.realpath(found))


def _as_postgres(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run `command` as the postgres user (the server refuses to run as root)."""
    if pwd.getpwuid(os.geteuid()).pw_name != "postgres":
        if os.geteuid() != 0:
            raise ReplicaUnavailable("making a replica needs root or the postgres user")
        command = ["runuser", "-u", "postgres", "--", *command]
    return subprocess.run(command, capture_output=True, text=True, **kwargs)


def allow_replication(admin: psycopg.Connection) -> None:
    """Make sure 127.0.0.1 may connect for replication (see the module doc)."""
    wal_level = admin.execute("SHOW wal_level").fetchone()[0]
    if wal_level not in ("replica", "logical"):
        raise ReplicaUnavailable(f"the test server runs wal_level={wal_level}; a replica needs"
                                 " replica (a change that needs a server restart)")
    senders = int(admin.execute("SHOW max_wal_senders").fetchone()[0])
    used = admin.execute("SELECT count(*) FROM pg_stat_replication").fetchone()[0]
    if senders - used < 2:  # pg_basebackup -X stream takes two while it copies
        raise ReplicaUnavailable(f"the test server has {senders} WAL senders, {used} in use"
                                 " (max_wal_senders: a change that needs a restart)")
    rules = admin.execute(
        "SELECT count(*) FROM pg_hba_file_rules WHERE error IS NULL AND type = 'host'"
        " AND 'replication' = ANY(database) AND auth_method = 'trust'"
        " AND address IN ('127.0.0.1', 'all')").fetchone()[0]
    if rules:
        return
    hba_file = admin.execute("SHOW hba_file").fetchone()[0]
    lines = admin.execute("SELECT pg_read_file(%s)", (hba_file,)).fetchone()[0].splitlines()
    if any("\\" in line for line in lines):
        raise ReplicaUnavailable(f"{hba_file} has no replication entry for 127.0.0.1 and"
                                 " cannot be rewritten line by line")
    # The server writes its own file (it owns it): one row a line, as COPY's text format
    # writes it (tabs are whitespace to pg_hba.conf; no line holds a backslash).
    lines = [line.replace("\t", " ") for line in lines]
    lines.insert(0, REPLICATION_RULE)
    with admin.transaction():
        admin.execute("CREATE TEMPORARY TABLE tally_hba_lines (n int, line text) ON COMMIT DROP")
        with admin.cursor().copy("COPY tally_hba_lines (n, line) FROM STDIN") as copy:
            for number, line in enumerate(lines):
                copy.write_row((number, line))
        admin.execute(sql.SQL("COPY (SELECT line FROM tally_hba_lines ORDER BY n) TO {}").format(
            sql.Literal(hba_file)))
    if not admin.execute("SELECT pg_reload_conf()").fetchone()[0]:
        raise ReplicaUnavailable("the test server did not reload its configuration")


SLOT_PREFIX = "tally_replica_"
FOLDER_PREFIX = "tally-replica-"


def _slot_name() -> str:
    return f"{SLOT_PREFIX}{os.getpid()}_{os.urandom(3).hex()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def drop_forgotten_slots(admin: psycopg.Connection) -> list[str]:
    """Drop the inactive replica slots whose test process is gone; return their names."""
    dropped = []
    for (name,) in admin.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE NOT active"
            " AND slot_name LIKE %s", (SLOT_PREFIX + "%",)).fetchall():
        pid = name[len(SLOT_PREFIX):].split("_", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            admin.execute("SELECT pg_drop_replication_slot(%s)", (name,))
            dropped.append(name)
    return dropped


def stop_forgotten_replicas(bindir: str | None = None, where: str | None = None) -> list[str]:
    """Stop (if running) and remove the replicas in `where` (the temporary folder) whose
    test process is gone; return their folders."""
    stopped = []
    bindir = bindir or _bindir()
    where = where or tempfile.gettempdir()
    for name in sorted(os.listdir(where)):
        pid = name[len(FOLDER_PREFIX):].split("-", 1)[0]
        if not name.startswith(FOLDER_PREFIX) or not pid.isdigit() or _pid_alive(int(pid)):
            continue
        folder = os.path.join(where, name)
        data = os.path.join(folder, "data")
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            _as_postgres([os.path.join(bindir, "pg_ctl"), "-D", data, "-w", "-t", "60",
                          "-m", "immediate", "stop"], timeout=120)
        shutil.rmtree(folder, ignore_errors=True)
        stopped.append(folder)
    return stopped


def _drop_slot(primary_url: str, slot: str) -> None:
    with _admin(primary_url) as admin:
        # The primary's WAL sender lets go of the slot shortly after the replica stops.
        _wait(f"the replication slot {slot} stayed active", lambda: not admin.execute(
            "SELECT COALESCE(bool_or(active), false) FROM pg_replication_slots"
            " WHERE slot_name = %s", (slot,)).fetchone()[0])
        admin.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                      " WHERE slot_name = %s", (slot,))


class StreamingReplica:
    def __init__(self, folder: str, port: int, bindir: str):
        self.folder = folder
        self.data = os.path.join(folder, "data")
        self.port = port
        self.bindir = bindir

    def url_for(self, primary_url: str) -> str:
        """`primary_url` (its database and options, a schema's search_path) on the replica."""
        parts = urlsplit(primary_url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(
            netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                               dbname="postgres", autocommit=True, connect_timeout=5)

    def pg_ctl(self, *args: str) -> None:
        result = _as_postgres([os.path.join(self.bindir, "pg_ctl"), "-D", self.data,
                               "-l", os.path.join(self.folder, "log"), *args], timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)}: {result.stdout}{result.stderr}"
                               f"{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            with open(os.path.join(self.folder, "log")) as log:
                return "".join(log.readlines()[-20:])
        except OSError:
            return ""

    def start(self) -> None:
        self.pg_ctl("-w", "-t", "60", "start")

    def stop(self) -> None:
        self.pg_ctl("-w", "-t", "60", "-m", "fast", "stop")

    def pause_replay(self) -> None:
        with self.connect() as conn:
            conn.execute("SELECT pg_wal_replay_pause()")

    def resume_replay(self) -> None:
        with self.connect() as conn:
            conn.execute("SELECT pg_wal_replay_resume()")


def _wait(what: str, ready, seconds: float = WAIT) -> None:
    if not wait_until(ready, seconds):
        raise RuntimeError(f"{what} within {seconds:g} s")


@contextmanager
def streaming_replica(primary_url: str):
    """A started hot standby of the test server (see the module doc)."""
    bindir = _bindir()
    stop_forgotten_replicas(bindir)
    admin = _admin(primary_url)
    try:
        allow_replication(admin)
        drop_forgotten_slots(admin)
        minimums = {name: admin.execute(f"SHOW {name}").fetchone()[0]  # sql-safe: constants
                    for name in STANDBY_MINIMUMS}
    finally:
        admin.close()
    parts = urlsplit(primary_url)
    folder = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-")
    postgres = pwd.getpwnam("postgres")
    os.chown(folder, postgres.pw_uid, postgres.pw_gid)
    replica = StreamingReplica(folder, free_port(), bindir)
    slot = _slot_name()
    try:
        # The slot is made, reserving WAL, before the copy starts: made by pg_basebackup -C
        # it reserves only from when its WAL streamer starts, after the copy's checkpoint,
        # and a server writing much WAL (the rest of the suite) had recycled the segment in
        # between ("requested WAL segment ... has already been removed").
        with _admin(primary_url) as admin:
            admin.execute("SELECT pg_create_physical_replication_slot(%s, true)", (slot,))
        copied = _as_postgres([
            os.path.join(bindir, "pg_basebackup"), "-h", parts.hostname or "127.0.0.1",
            "-p", str(parts.port or 5432), "-U", "postgres", "-D", replica.data,
            "-X", "stream", "-R", "-S", slot, "-c", "fast", "--no-sync"], timeout=600)
        if copied.returncode != 0:
            raise ReplicaUnavailable(f"pg_basebackup failed: {copied.stderr.strip()}")
        settings = {
            "port": replica.port, "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{folder}'", "hot_standby": "on",
            "shared_buffers": "'32MB'", "fsync": "off", "logging_collector": "off",
            "hot_standby_feedback": "on", "wal_receiver_status_interval": 1,
            **minimums}
        conf = "".join(f"{name} = {value}\n" for name, value in settings.items())
        for name, text in (("postgresql.conf", conf),
                           ("pg_hba.conf", "local all all trust\n"
                                           "host all all 127.0.0.1/32 trust\n"),
                           ("pg_ident.conf", "")):
            path = os.path.join(replica.data, name)
            with open(path, "w") as file:
                file.write(text)
            os.chown(path, postgres.pw_uid, postgres.pw_gid)
        replica.start()

        def streaming() -> bool:
            with replica.connect() as conn:
                return conn.execute(
                    "SELECT pg_is_in_recovery() AND EXISTS (SELECT FROM pg_stat_wal_receiver"
                    " WHERE status = 'streaming')").fetchone()[0]

        _wait("the replica was not streaming", streaming)
        yield replica
    finally:
        try:
            replica.pg_ctl("-w", "-t", "60", "-m", "immediate", "stop")
        except RuntimeError:
            pass  # it was not running
        try:
            _drop_slot(primary_url, slot)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def wait_replayed(primary_url: str, replica: StreamingReplica, seconds: float = WAIT) -> None:
    """Return once the replica has replayed everything the primary had written."""
    with _admin(primary_url) as admin:
        target = admin.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
    with replica.connect() as conn:
        if not wait_until(lambda: conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)).fetchone()[0],
                seconds):
            raise RuntimeError(f"the replica did not catch up within {seconds:g} s; its log:\n"
                               f"{replica.log_tail()}")
