"""A streaming replica of the PostgreSQL primary that reads may use (TALLY_DATABASE_READ_URL).

Reads over HTTP (storage/reads.py: reports, dashboard pages, shared links) run on the
replica while it answers and is at most `max_lag` seconds behind the primary, and on the
primary otherwise. What a read writes (final days stored) still goes to the primary
(storage.postgres.PostgresDatabase.transaction).

How far behind, without trusting the two servers' clocks or a replay timestamp (which
stops moving when the primary is idle): each check reads the primary's WAL position,
then the position the replica has replayed. Everything the primary had committed when a
position was read is on the replica once it has replayed past that position. So the
replica's data is at most `now - t` old, `t` the time of the latest primary position it
has replayed; positions are remembered for `max_lag` seconds, and a replica that replayed
none of them is lagging. A check costs the primary one `pg_current_wal_lsn()` and the
replica one query, at most once per CHECK_INTERVAL per process.

`max_lag` is at most an hour: a day is final (reports/days/traffic_days.py) a day after it ends, and an
event may be stored at most an hour late, so a day that looks final on the replica is
final on the primary too and its figures are the primary's.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable

import psycopg
from psycopg_pool import ConnectionPool

from storage.statements import native

log = logging.getLogger("tally")

# TALLY_REPLICA_MAX_LAG's default: seconds the replica's data may be behind the primary's.
MAX_LAG = 10.0
# Seconds a verdict on the replica holds before it is checked again.
CHECK_INTERVAL = 1.0
# Seconds a replica that did not answer is left alone before it is tried again.
RETRY_AFTER = 5.0
# Seconds to wait for the replica to accept a connection.
CONNECT_TIMEOUT_S = 2

# WAL positions as byte offsets (numeric, read back as int), on psycopg's own connections.
PRIMARY_POSITION = native("postgres", "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
REPLICA_POSITION = native(
    "postgres", "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn() - '0/0'::pg_lsn")


class Replica:
    """The replica's connections and whether reads may use it, for one process at a time."""

    def __init__(self, url: str, max_lag: float, *, pool_size: int,
                 connection_options: dict, configure: Callable,
                 clock: Callable[[], float] = time.monotonic):
        self.url = url
        self.max_lag = float(max_lag)
        self.pool_size = pool_size
        self.clock = clock
        self._options = {**connection_options, "connect_timeout": CONNECT_TIMEOUT_S}
        self._configure = configure
        self._lock = threading.Lock()
        self._pool: ConnectionPool | None = None
        self._pid: int | None = None
        self._positions: deque[tuple[float, int]] = deque()
        self._next_check = -math.inf
        self._usable = False
        self._why = "not checked yet"

    def usable(self, primary_position: Callable[[], int]) -> bool:
        """Whether a read may start on the replica now. `primary_position()`: the
        primary's current WAL position (raises psycopg.Error when it cannot be read)."""
        with self._lock:
            self._own_process()
            now = self.clock()
            if now < self._next_check:
                return self._usable
            usable, why, wait = self._check(primary_position, now)
            if usable != self._usable:
                if usable:
                    log.info("reports read from the replica again")
                else:
                    log.warning("reports read from the primary: the replica %s", why)
            self._usable, self._why = usable, why
            self._next_check = self.clock() + wait
            return usable

    def _check(self, primary_position: Callable[[], int],
               now: float) -> tuple[bool, str, float]:
        """(usable, why not, seconds until the next check)."""
        try:
            position = int(primary_position())
        except psycopg.Error:
            return False, "cannot be checked (the primary did not answer)", CHECK_INTERVAL
        positions = self._positions
        positions.append((now, position))
        while positions and positions[0][0] < now - self.max_lag:
            positions.popleft()
        try:
            with self._connections().connection() as raw:
                in_recovery, replayed = raw.execute(REPLICA_POSITION).fetchone()
        except (psycopg.Error, OSError) as exc:
            self._drop_pool()
            log.info("replica check failed: %s", " ".join(str(exc).split()))
            return False, "did not answer", RETRY_AFTER
        if not in_recovery or replayed is None:
            return False, "is not replaying a primary's WAL", CHECK_INTERVAL
        if not any(seen <= replayed for _, seen in positions):
            return False, f"is more than {self.max_lag:g} s behind", CHECK_INTERVAL
        return True, "is current", CHECK_INTERVAL

    def getconn(self) -> psycopg.Connection | None:
        """A connection to the replica, or None when it does not answer (it is then
        left alone for RETRY_AFTER seconds)."""
        with self._lock:
            self._own_process()
            pool = self._connections()
        try:
            return pool.getconn()
        except Exception as exc:  # PoolTimeout, a closed pool, a failed connection
            self.lost(exc)
            return None

    def putconn(self, raw: psycopg.Connection) -> None:
        with self._lock:
            pool = self._pool if self._pid == os.getpid() else None
        if pool is None:
            raw.close()
            return
        try:
            pool.putconn(raw)
        except Exception:  # the pool was closed since: the connection goes with it
            raw.close()

    def lost(self, exc: BaseException) -> None:
        """The replica failed a read: reads go to the primary for RETRY_AFTER seconds."""
        with self._lock:
            if self._usable:
                log.warning("reports read from the primary: the replica failed (%s)",
                            " ".join(str(exc).split()))
            self._usable, self._why = False, "did not answer"
            self._next_check = self.clock() + RETRY_AFTER
            self._drop_pool()

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._drop_pool()

    def _own_process(self) -> None:
        if self._pid != os.getpid():  # after a fork the parent's pool is left alone
            self._pool, self._pid = None, os.getpid()
            self._positions.clear()
            self._next_check = -math.inf
            self._usable = False

    def _connections(self) -> ConnectionPool:
        if self._pool is None:
            configure = self._configure
            self._pool = ConnectionPool(
                self.url, min_size=1, max_size=self.pool_size, open=True, name="tally-replica",
                kwargs=self._options, configure=configure,
                check=ConnectionPool.check_connection, timeout=CONNECT_TIMEOUT_S)
            self._pid = os.getpid()
        return self._pool

    def _drop_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.close(timeout=0)
