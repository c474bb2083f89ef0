"""Payments, their customers and subscriptions: one durable upsert per request.

`PaymentStore.upsert` writes the payment, its customer and its subscription and returns
once they are committed and durable (SQLite's synchronous=FULL, PostgreSQL's
synchronous_commit). Errors come out as storage.db's StorageBusy / StorageError.

The commits are grouped: a worker's payments go to one writer thread with a connection
of its own, which takes every payment waiting into one transaction (on PostgreSQL
holding the locks of their sites only), then also those that arrived while it waited for
the write lock (on PostgreSQL, those of the same sites that arrived while it waited for
their locks), a payment that fails rolled back alone (only its request
sees the error), and answers each request once the COMMIT is durable. One lock wait,
one commit and one log flush then serve all the payments that arrived meanwhile,
instead of one each. On SQLite the group goes under one SAVEPOINT and only a group in
which a payment failed runs again with a SAVEPOINT each (storage.db.grouped_transaction),
and a payment reads back the observation it replaces (five statements for most
payments). On PostgreSQL a payment is one statement that reads nothing back, so the
group goes in one pipeline read back twice (once its sites' locks are held, then at
its COMMIT), without SAVEPOINTs, and only a group in which
a payment failed runs again a SAVEPOINT and a Sync each
(PostgresDatabase.grouped_transaction); the writer's connection prepares its
statements, and a group that a deadlock or serialization failure ended runs again.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import sys
import threading
from collections import deque
from collections.abc import Callable
from decimal import Decimal

import orjson

from storage.browser_ids import browser_id_key, browser_visitor_id, is_browser_id
from storage.db import Database, StorageBusy, StorageError, is_transient
from storage.dialect import dialect
from storage.replan import ReplanSchedule
from storage.statements import native, statement
from validation.common import decimal_text
from validation.payment import Customer, Instant, Payment, Subscription

# Customer fields a payment may leave out; a value given by a payment at least as new
# (by paid_at) as the stored one wins, an older payment only fills empty fields.
_MERGED_CUSTOMER_COLUMNS = ("email", "user_id", "visitor_id", "name", "country", "metadata")

_MERGE_CUSTOMER_COLUMN = (
    "{c} = CASE WHEN excluded.as_of_ms >= customers.as_of_ms THEN coalesce(excluded.{c}, customers.{c})"
    " ELSE coalesce(customers.{c}, excluded.{c}) END"
)
_UPSERT_CUSTOMER = statement(
    "INSERT INTO customers (site_id, customer_id, email, user_id, visitor_id, name, country,"  # noqa: S608 - fixed columns
    " metadata, as_of_ms, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (site_id, customer_id) DO UPDATE SET "
    # sql-safe: identifiers from the fixed tuple _MERGED_CUSTOMER_COLUMNS; values stay parameters
    + ", ".join(_MERGE_CUSTOMER_COLUMN.format(c=column) for column in _MERGED_CUSTOMER_COLUMNS)
    + ", as_of_ms = max(customers.as_of_ms, excluded.as_of_ms), updated_at = excluded.updated_at"
)

_UPSERT_PAYMENT = statement(
    "INSERT INTO payments (site_id, payment_id, customer_id, amount, currency, fee, kind, status,"
    " paid_at, paid_at_ms, metadata, subscription_id, created_at, updated_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (site_id, payment_id) DO UPDATE SET customer_id = excluded.customer_id,"
    " amount = excluded.amount, currency = excluded.currency, fee = excluded.fee,"
    " kind = excluded.kind, status = excluded.status, paid_at = excluded.paid_at,"
    " paid_at_ms = excluded.paid_at_ms, metadata = excluded.metadata,"
    " subscription_id = excluded.subscription_id, updated_at = excluded.updated_at"
)

# The subscription state both tables share, in this order; the statements below splice
# these fixed column names (and as many `?`) and nothing else.
SUBSCRIPTION_STATE = (
    "subscription_id", "customer_id", "payment_id", "effective_at_ms", "currency", "plan",
    "interval", "status", "amount", "started_at", "started_at_ms", "current_period_end",
    "current_period_end_ms", "canceled_at", "canceled_at_ms", "ended_at", "ended_at_ms",
)
_STATE_COLUMNS = ", ".join(SUBSCRIPTION_STATE)
_STATE_MARKS = ", ".join("?" for _ in SUBSCRIPTION_STATE)

_INSERT_OBSERVATION = statement(
    f"INSERT INTO subscription_observations (site_id, {_STATE_COLUMNS}, received_at)"  # noqa: S608 - fixed columns
    f" VALUES (?, {_STATE_MARKS}, ?)"
)
_SUBSCRIPTION_COPY = ", ".join(f"{column} = excluded.{column}" for column in SUBSCRIPTION_STATE[1:])
_OBSERVED_COLUMNS = ", ".join(f"o.{column}" for column in SUBSCRIPTION_STATE)
# The subscriptions row becomes a copy of the subscription's latest observation: read
# back by nothing, so a pipelined payment never waits on it.
_REFRESH_SUBSCRIPTION = statement(
    f"INSERT INTO subscriptions (site_id, {_STATE_COLUMNS}, updated_at)"  # noqa: S608 - fixed columns
    f" SELECT o.site_id, {_OBSERVED_COLUMNS}, ?3 FROM subscription_observations o"
    " WHERE o.site_id = ?1 AND o.subscription_id = ?2"
    " ORDER BY o.effective_at_ms DESC, o.id DESC LIMIT 1"
    # sql-safe: identifiers from the fixed tuple SUBSCRIPTION_STATE
    f" ON CONFLICT (site_id, subscription_id) DO UPDATE SET {_SUBSCRIPTION_COPY},"
    " updated_at = excluded.updated_at"
)
# SQLite's writer reads back, so it learns the payment's previous subscription from the
# observation it replaces, and refreshes or deletes that subscription only when the
# payment moves off it.
_TAKE_OBSERVATION_OF_PAYMENT = native(
    "sqlite",
    "DELETE FROM subscription_observations WHERE site_id = ? AND payment_id = ?"
    " RETURNING subscription_id")
_DELETE_UNOBSERVED_SUBSCRIPTION = native(
    "sqlite",
    "DELETE FROM subscriptions WHERE site_id = ?1 AND subscription_id = ?2"
    " AND NOT EXISTS (SELECT 1 FROM subscription_observations o WHERE o.site_id = ?1"
    " AND o.subscription_id = ?2)")


# On PostgreSQL a payment is one statement: the customer's and the payment's upserts, the
# payment's observation replaced, the subscription it moves off and the one it is on
# refreshed, as SQLite's statements do one after another. Each sub-statement reads the
# state before the statement: the payment's old observation is excluded by payment_id,
# the new one joins its subscription's observations by UNION, and the foreign keys and
# triggers are checked at the statement's end. The previous subscription is found once
# (the observation the DELETE returns; nothing runs for it when there is none).
# ?1 site, ?2 payment_id, ?3 its subscription (NULL: none), ?4 now; the customer's
# columns from ?5, the payment's from ?13, the subscription's SUBSCRIPTION_STATE from ?21.
_PG_CUSTOMER_COLUMNS = ("customer_id", *_MERGED_CUSTOMER_COLUMNS, "as_of_ms")
_PG_PAYMENT_COLUMNS = ("amount", "currency", "fee", "kind", "status", "paid_at", "paid_at_ms",
                       "metadata")
_PG_STATE_FIRST = 5 + len(_PG_CUSTOMER_COLUMNS) + len(_PG_PAYMENT_COLUMNS)


def _marks(first: int, count: int) -> str:
    return ", ".join(f"?{n}" for n in range(first, first + count))


# sql-safe: identifiers from the fixed tuples above; values stay parameters
_PG_PAYMENT = (
    f"customer AS (INSERT INTO customers (site_id, {', '.join(_PG_CUSTOMER_COLUMNS)},"  # noqa: S608 - fixed columns
    f" created_at, updated_at) VALUES (?1, {_marks(5, len(_PG_CUSTOMER_COLUMNS))}, ?4, ?4)"
    " ON CONFLICT (site_id, customer_id) DO UPDATE SET "
    + ", ".join(_MERGE_CUSTOMER_COLUMN.format(c=column) for column in _MERGED_CUSTOMER_COLUMNS)
    + ", as_of_ms = greatest(customers.as_of_ms, excluded.as_of_ms),"  # noqa: S608 - fixed columns
    " updated_at = excluded.updated_at RETURNING 1),"
    " payment AS (INSERT INTO payments (site_id, payment_id, customer_id,"
    f" {', '.join(_PG_PAYMENT_COLUMNS)}, subscription_id, created_at, updated_at)"  # noqa: S608 - fixed columns
    f" VALUES (?1, ?2, ?5, {_marks(13, len(_PG_PAYMENT_COLUMNS))}, ?3, ?4, ?4)"
    " ON CONFLICT (site_id, payment_id) DO UPDATE SET customer_id = excluded.customer_id, "  # noqa: S608 - fixed columns
    + ", ".join(f"{column} = excluded.{column}" for column in _PG_PAYMENT_COLUMNS)
    + ", subscription_id = excluded.subscription_id, updated_at = excluded.updated_at"  # noqa: S608 - fixed columns
    " RETURNING 1),"
    " old AS (DELETE FROM subscription_observations WHERE site_id = ?1 AND payment_id = ?2"
    " RETURNING subscription_id),"
    " previous AS (SELECT subscription_id FROM old WHERE ?3 IS NULL OR subscription_id <> ?3),"
    " previous_latest AS (SELECT l.* FROM previous CROSS JOIN LATERAL"
    f" (SELECT o.site_id, {_OBSERVED_COLUMNS} FROM subscription_observations o"
    "  WHERE o.site_id = ?1 AND o.subscription_id = previous.subscription_id"
    "  AND (o.payment_id IS NULL OR o.payment_id <> ?2)"
    "  ORDER BY o.effective_at_ms DESC, o.id DESC LIMIT 1) l),"
    f" previous_refreshed AS (INSERT INTO subscriptions (site_id, {_STATE_COLUMNS}, updated_at)"
    f"  SELECT site_id, {_STATE_COLUMNS}, ?4 FROM previous_latest"
    f"  ON CONFLICT (site_id, subscription_id) DO UPDATE SET {_SUBSCRIPTION_COPY},"
    "  updated_at = excluded.updated_at RETURNING 1)"
)
_PG_PAYMENT_WITHOUT_SUBSCRIPTION = native("postgres", (
    f"WITH {_PG_PAYMENT}"  # noqa: S608 - fixed columns
    " DELETE FROM subscriptions WHERE site_id = ?1"
    " AND subscription_id = (SELECT subscription_id FROM previous)"
    " AND EXISTS (SELECT FROM previous) AND NOT EXISTS (SELECT FROM previous_latest)"))
_PG_PAYMENT_WITH_SUBSCRIPTION = native("postgres", (
    f"WITH {_PG_PAYMENT},"  # noqa: S608 - fixed columns
    " previous_deleted AS (DELETE FROM subscriptions WHERE site_id = ?1"
    "  AND subscription_id = (SELECT subscription_id FROM previous)"
    "  AND EXISTS (SELECT FROM previous) AND NOT EXISTS (SELECT FROM previous_latest)"
    "  RETURNING 1),"
    # After the old observation's DELETE (the unique key (site_id, payment_id)).
    f" new AS (INSERT INTO subscription_observations (site_id, {_STATE_COLUMNS}, received_at)"
    f"  SELECT ?1, {_marks(_PG_STATE_FIRST, len(SUBSCRIPTION_STATE))}, ?4"
    "  FROM (SELECT count(*) FROM old) AS deleted"
    f"  RETURNING id, site_id, {_STATE_COLUMNS}),"
    f" latest AS (SELECT site_id, {_STATE_COLUMNS} FROM"
    f"  (SELECT o.id, o.site_id, {_OBSERVED_COLUMNS} FROM subscription_observations o"
    "   WHERE o.site_id = ?1 AND o.subscription_id = ?3"
    "   AND (o.payment_id IS NULL OR o.payment_id <> ?2)"
    f"   UNION ALL SELECT id, site_id, {_STATE_COLUMNS} FROM new) l"
    "  ORDER BY effective_at_ms DESC, id DESC LIMIT 1)"
    f" INSERT INTO subscriptions (site_id, {_STATE_COLUMNS}, updated_at)"
    f" SELECT site_id, {_STATE_COLUMNS}, ?4 FROM latest"
    f" ON CONFLICT (site_id, subscription_id) DO UPDATE SET {_SUBSCRIPTION_COPY},"
    " updated_at = excluded.updated_at"))


# On PostgreSQL the payment writers of one site (one a worker, one a host) write at the
# same time: they hold the site's lock shared, which the flush and the site's other
# writers take exclusively. What two of them may both write is serialized by locks of
# these statements, taken before any row: each payment's and its customer's (a
# payment's statement reads the rows of its payment id under its snapshot, and two
# groups locking customer rows in opposite orders would deadlock), then, once no other
# group can move these payments, each subscription the group writes or moves a payment
# off (a payment's statement copies its subscription's latest observation under its
# snapshot, so another group's observation of the same subscription must be committed
# or not begun). Each statement takes its locks in key order, and every group takes
# the first's before the second's, so two groups never wait for each other in a cycle.
# ?1 the sites, ?2 the payment ids, ?3 the customer ids, in the same order.
_PG_LOCK_PAYMENTS = native("postgres", (
    "SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT hashtextextended(concat_ws(chr(31),"
    " current_schema(), u.site, u.kind, u.id), 0) AS k FROM"
    " (SELECT site, 'payment' AS kind, payment AS id FROM unnest(?1::bigint[], ?2::text[]) AS p (site, payment)"
    "  UNION ALL SELECT site, 'customer', customer FROM unnest(?1::bigint[], ?3::text[]) AS c (site, customer)) u"
    ") l ORDER BY k"))
# ?1 the sites, ?2 the payment ids, ?3 their subscriptions (NULL: none), in the same order.
_PG_LOCK_SUBSCRIPTIONS = native("postgres", (
    "SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT hashtextextended(concat_ws(chr(31),"
    " current_schema(), u.site, 'subscription', u.id), 0) AS k FROM"
    " (SELECT site, subscription AS id FROM unnest(?1::bigint[], ?3::text[]) AS n (site, subscription)"
    "  WHERE subscription IS NOT NULL"
    "  UNION ALL SELECT o.site_id, o.subscription_id FROM unnest(?1::bigint[], ?2::text[]) AS p (site, payment)"
    "  JOIN subscription_observations o ON o.site_id = p.site AND o.payment_id = p.payment) u"
    ") l ORDER BY k"))


def lock_payments(conn, items: list[tuple[int, Payment]]):
    """Take the PostgreSQL locks that let these payments (site, payment) be written while
    other payment writers of their sites write theirs (above); returns the last
    statement's cursor."""
    sites = [site_id for site_id, _ in items]
    ids = [payment.payment_id for _, payment in items]
    conn.execute(_PG_LOCK_PAYMENTS,
                 (sites, ids, [payment.customer.id for _, payment in items]))
    return conn.execute(_PG_LOCK_SUBSCRIPTIONS, (sites, ids, [
        None if payment.subscription is None else payment.subscription.id
        for _, payment in items]))


# The most payments one group transaction takes: bounds how long the write lock is held
# (about 0.3 ms of statements a payment) while the rest wait for the next group.
MAX_GROUP = 256


class PaymentStore:
    def __init__(self, db: Database, clock: Callable[[], float]):
        self.db = db
        self.clock = clock
        self.group = GroupCommit(db)

    def upsert(self, site_id: int, payment: Payment) -> None:
        """Store the payment (replacing one with its payment_id), its customer and subscription."""
        self.group.store(site_id, payment, int(self.clock() * 1000))

    def start(self) -> None:
        """Nothing to start: a process's writer starts with its first payment."""

    def stop(self, timeout: float = 25.0) -> None:
        """Answer the payments waiting, end the writer and close its connection."""
        self.group.stop(timeout)

    @classmethod
    def write(cls, conn: sqlite3.Connection, site_id: int, payment: Payment, now_ms: int) -> None:
        """upsert's writes, inside a transaction the caller holds (the Stripe webhook's).
        On PostgreSQL one statement that reads nothing back (but a browser id's key), sent
        pipelined by the payment writer. On SQLite, where a result costs no round trip, the
        observation a payment replaces is read back, so a payment that keeps its
        subscription runs five statements rather than seven."""
        customer = payment.customer
        visitor = visitor_id_to_store(conn, site_id, customer.visitor_id, now_ms)
        subscription = payment.subscription
        payment_row = (
            decimal_text(payment.amount), payment.currency, _money_text(payment.fee),
            payment.kind, payment.status, payment.paid_at.text, payment.paid_at.unix_ms,
            _json_text(payment.metadata))
        if dialect(conn) == "postgres":
            conn.execute(
                _PG_PAYMENT_WITHOUT_SUBSCRIPTION if subscription is None
                else _PG_PAYMENT_WITH_SUBSCRIPTION,
                (site_id, payment.payment_id, subscription.id if subscription else None, now_ms,
                 customer.id, customer.email, customer.user_id, visitor, customer.name,
                 customer.country, _json_text(customer.metadata), payment.paid_at.unix_ms,
                 *payment_row,
                 *(() if subscription is None else _subscription_state(payment, subscription))))
            return
        _upsert_customer(conn, site_id, customer, visitor, payment.paid_at.unix_ms, now_ms)
        conn.execute(
            _UPSERT_PAYMENT,
            (site_id, payment.payment_id, customer.id, *payment_row,
             subscription.id if subscription else None, now_ms, now_ms),
        )
        _write_observation_reading_back(conn, site_id, payment, now_ms)


def _write_observation_reading_back(conn: sqlite3.Connection, site_id: int, payment: Payment,
                                    now_ms: int) -> None:
    """PaymentStore.write's observation and subscriptions on SQLite, as PostgreSQL's
    statements leave them: the payment's observation becomes its new subscription block
    (or none); the subscriptions it moves off and onto are copies of their latest
    observations, and one left with none goes."""
    subscription = payment.subscription
    row = conn.execute(_TAKE_OBSERVATION_OF_PAYMENT, (site_id, payment.payment_id)).fetchone()
    if subscription is not None:
        conn.execute(_INSERT_OBSERVATION,
                     (site_id, *_subscription_state(payment, subscription), now_ms))
        refresh_subscription(conn, site_id, subscription.id, now_ms)
    if row is not None and (subscription is None or row[0] != subscription.id):
        refresh_subscription(conn, site_id, row[0], now_ms)
        conn.execute(_DELETE_UNOBSERVED_SUBSCRIPTION, (site_id, row[0]))


class _Waiting:
    __slots__ = ("site_id", "payment", "now_ms", "done", "error", "taken")

    def __init__(self, site_id: int, payment: Payment, now_ms: int):
        self.site_id = site_id
        self.payment = payment
        self.now_ms = now_ms
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.taken = False  # in a transaction of the writer: its answer is coming


# A writer idle this long closes its connection (on PostgreSQL one outside the pool, a
# server connection a worker would otherwise keep all day for a rare payment).
IDLE_CLOSE_S = 30.0
# Runs of a group that a deadlock or serialization failure ended (a new transaction each).
CONFLICT_ATTEMPTS = 3
# On PostgreSQL the writer's statements are planned once, by the 6th run on a connection, and
# the foreign keys' checks likewise; a plan made while the tables were nearly empty (and
# without statistics: autovacuum off, or not yet run) may read a payment's or subscription's
# rows through an index on site_id alone, every row of the site each time, and nothing but
# ANALYZE plans it again. So the writer has its plans made again each time the payments
# stored on its connection double from this many.
REPLAN_FIRST = 32


class GroupCommit:
    """A worker's payment writer: one thread, one connection of its own, one transaction
    for every payment waiting (on PostgreSQL holding their sites' locks), a SAVEPOINT
    each (on PostgreSQL only once a payment of the group failed), answered after the
    COMMIT is durable (SQLite's synchronous=FULL, PostgreSQL's synchronous_commit)."""

    def __init__(self, db: Database):
        self.db = db
        self._waiting: deque[_Waiting] = deque()
        self._arrived = threading.Condition(threading.Lock())
        self._pid: int | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._conn = None
        self._conn_pid: int | None = None
        self._conn_lock = threading.Lock()
        self.groups = 0  # transactions committed or failed, for tests and the bench
        self.connections = 0  # connections the writer made, for tests
        self._replans = ReplanSchedule(REPLAN_FIRST)  # payments stored on the connection

    def store(self, site_id: int, payment: Payment, now_ms: int) -> None:
        """Returns once the payment is on disk; raises StorageBusy / StorageError (only
        this payment's own, or its group's if the transaction as a whole failed)."""
        waiting = _Waiting(site_id, payment, now_ms)
        with self._arrived:
            if self._pid != os.getpid():
                # First use in this process (a forked worker has no writer thread yet).
                self._waiting.clear()
                self._stopping = False
                self._thread = threading.Thread(target=self._run, name="tally-payments",
                                                daemon=True)
                self._thread.start()
                self._pid = os.getpid()
            self._waiting.append(waiting)
            self._arrived.notify()
        # The writer's wait for the lock is bounded by the busy timeout; past that and a
        # margin the request gives up, unless its transaction has started.
        if not waiting.done.wait(self.db.busy_timeout_ms / 1000 + 5.0):
            with self._arrived:
                if not waiting.taken:
                    self._waiting.remove(waiting)
                    raise StorageBusy("the payment writer did not start within its bound")
            waiting.done.wait()
        if waiting.error is not None:
            raise waiting.error

    def stop(self, timeout: float = 25.0) -> None:
        """The payments already waiting are stored and answered; then the writer ends and
        its connection is closed. A later payment starts a new writer."""
        with self._arrived:
            thread = self._thread if self._pid == os.getpid() else None
            self._stopping = True
            self._arrived.notify()
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return  # still storing a group: its connection stays with it
        with self._arrived:
            self._pid = self._thread = None
        self._close_connection()

    def connection(self):
        """The writer's connection (made on first use, and again after it was closed)."""
        with self._conn_lock:
            if self._conn is None or self._conn_pid != os.getpid():
                self._conn = self.db.connect(prepared=True)
                self._conn_pid = os.getpid()
                self.connections += 1
                self._replans.restart(REPLAN_FIRST)
            return self._conn

    def _close_connection(self, conn=None) -> None:
        """Close the writer's connection (only `conn`, if given and still the writer's); a
        parent's connection inherited through a fork is left to the parent."""
        with self._conn_lock:
            if self._conn is None or (conn is not None and conn is not self._conn):
                return
            current, self._conn = self._conn, None
            if self._conn_pid != os.getpid():
                return
        with contextlib.suppress(Exception):  # a connection already broken closes anyway
            current.close()

    def _run(self) -> None:
        while True:
            with self._arrived:
                while not self._waiting:
                    if self._stopping:
                        return
                    if not self._arrived.wait(IDLE_CLOSE_S) and not self._waiting:
                        self._close_connection()
                group = self._take(MAX_GROUP)
            try:
                self._store(group)
            finally:
                self.groups += 1
                for waiting in group:
                    waiting.done.set()

    def _take(self, most: int) -> list[_Waiting]:
        """Up to `most` of the payments waiting, in arrival order, now the writer's (called
        with _arrived held)."""
        group = [self._waiting.popleft() for _ in range(min(most, len(self._waiting)))]
        for waiting in group:
            waiting.taken = True
        return group

    def _take_of(self, sites: frozenset[int], most: int) -> list[_Waiting]:
        """_take's, of these sites only; the others keep their order (called with
        _arrived held)."""
        group, waiting = [], self._waiting
        for _ in range(len(waiting)):
            payment = waiting.popleft()
            if payment.site_id in sites and len(group) < most:
                payment.taken = True
                group.append(payment)
            else:
                waiting.append(payment)
        return group

    def _more(self, group: list[_Waiting],
              sites: frozenset[int] | None = None) -> Callable[[], list[_Waiting]]:
        """What arrived while the group waited for the write lock (SQLite's) or for its
        sites' locks (PostgreSQL's: of those `sites` only, as a lock taken out of site
        order could deadlock), up to MAX_GROUP in all: the lock is the other workers'
        commits, so a group taken once it is held is larger and the payments that came
        meanwhile wait for no further commit."""
        def more() -> list[_Waiting]:
            with self._arrived:
                if sites is None:
                    return self._take(MAX_GROUP - len(group))
                return self._take_of(sites, MAX_GROUP - len(group))
        return more

    def _store(self, group: list[_Waiting]) -> None:
        """One transaction for the group, run again on a new connection when the server
        ended the writer's (once), and again after a deadlock or serialization failure."""
        conflicts = reconnected = 0
        while True:
            conn = None
            try:
                conn = self.connection()
                self._commit(conn, group)
                self._replace_if_out_of_step(conn)
                return
            except BaseException as exc:  # the transaction as a whole: every payment's answer
                lost = conn is not None and getattr(conn, "closed", False)
                self._replace_if_out_of_step(conn)
                if lost or (conn is not None and not isinstance(
                        exc, sqlite3.OperationalError | StorageError)):
                    self._close_connection(conn)
                if lost and not reconnected and isinstance(exc, Exception):
                    reconnected += 1
                    continue
                if _conflict(exc) and conflicts + 1 < CONFLICT_ATTEMPTS:
                    conflicts += 1
                    continue
                error = exc if isinstance(exc, StorageError) else _mapped(exc)
                for waiting in group:
                    waiting.error = error
                return

    def _replace_if_out_of_step(self, conn) -> None:
        """A PostgreSQL connection whose pipeline failed part way stopped preparing
        (PostgresConnection.stop_preparing): the next group gets a new one."""
        if getattr(conn, "out_of_step", False):
            self._close_connection(conn)

    def _commit(self, conn, group: list[_Waiting]) -> None:
        def write(waiting: _Waiting) -> None:
            PaymentStore.write(conn, waiting.site_id, waiting.payment, waiting.now_ms)

        # Grows the group in place: _run answers and _store fails every payment in it.
        if dialect(conn) == "postgres":
            if self._replans.due():
                conn.discard_plans()
            sites = frozenset(waiting.site_id for waiting in group)
            failures = self.db.grouped_transaction(
                conn, group, write, sites=sorted(sites), more=self._more(group, sites),
                lock_items=lambda items: lock_payments(
                    conn, [(waiting.site_id, waiting.payment) for waiting in items]))
            self._replans.add(len(group))
        else:
            failures = self.db.grouped_transaction(conn, group, write, more=self._more(group))
        for waiting, failure in zip(group, failures, strict=True):
            waiting.error = None if failure is None else _mapped(failure)  # api/payments.py logs it


def _conflict(exc: BaseException) -> bool:
    """A deadlock or serialization failure (PostgreSQL's; SQLite has one writer)."""
    postgres = sys.modules.get("storage.postgres")  # loaded when PostgreSQL is the backend
    return postgres is not None and postgres.is_conflict(exc)


def _mapped(exc: BaseException) -> BaseException:
    """A payment's failure as the request sees it: sqlite3's errors as StorageBusy /
    StorageError (Database.transaction's mapping); anything else as it is."""
    if isinstance(exc, sqlite3.Error):
        error = StorageBusy(str(exc)) if is_transient(exc) else StorageError(str(exc))
        error.__cause__ = exc
        return error
    return exc


def write_customer(conn: sqlite3.Connection, site_id: int, customer: Customer, as_of_ms: int,
                   now_ms: int, random_bytes: Callable[[int], bytes] = secrets.token_bytes) -> None:
    """Insert or merge the customer: values as of an instant at least as new as the stored
    ones win; older ones only fill empty fields. A visitor_id that is the tracking script's
    tally_vid is stored as the visitor id (decimal) its events carry; `random_bytes` makes
    the browser id key if none exists yet."""
    visitor = visitor_id_to_store(conn, site_id, customer.visitor_id, now_ms, random_bytes)
    _upsert_customer(conn, site_id, customer, visitor, as_of_ms, now_ms)


def visitor_id_to_store(conn: sqlite3.Connection, site_id: int, visitor: str | None, now_ms: int,
                        random_bytes: Callable[[int], bytes] = secrets.token_bytes) -> str | None:
    """A customer's visitor_id as stored: a tally_vid as the visitor id (decimal) its events
    carry (`random_bytes` makes the browser id key if none exists yet), else as given."""
    if is_browser_id(visitor):
        key = browser_id_key(conn, random_bytes, now_ms)
        return str(browser_visitor_id(key, site_id, visitor))
    return visitor


def _upsert_customer(conn: sqlite3.Connection, site_id: int, customer: Customer,
                     visitor: str | None, as_of_ms: int, now_ms: int) -> None:
    conn.execute(
        _UPSERT_CUSTOMER,
        (site_id, customer.id, customer.email, customer.user_id, visitor,
         customer.name, customer.country, _json_text(customer.metadata), as_of_ms, now_ms,
         now_ms),
    )


def refresh_subscription(conn: sqlite3.Connection, site_id: int, subscription_id: str,
                         now_ms: int) -> None:
    """The subscriptions row becomes a copy of the subscription's latest observation (the
    subscription has one)."""
    conn.execute(_REFRESH_SUBSCRIPTION, (site_id, subscription_id, now_ms))


def _subscription_state(payment: Payment, subscription: Subscription) -> tuple:
    return subscription_state(subscription, payment.customer.id, payment.payment_id,
                              payment.paid_at.unix_ms, payment.currency)


def subscription_state(subscription: Subscription, customer_id: str, payment_id: str | None,
                       effective_at_ms: int, currency: str) -> tuple:
    """The SUBSCRIPTION_STATE columns of an observation, in order."""
    return (
        subscription.id,
        customer_id,
        payment_id,
        effective_at_ms,
        currency,
        subscription.plan,
        subscription.interval,
        subscription.status,
        _money_text(subscription.amount),
        *_instant_columns(subscription.started_at),
        *_instant_columns(subscription.current_period_end),
        *_instant_columns(subscription.canceled_at),
        *_instant_columns(subscription.ended_at),
    )


def _instant_columns(instant: Instant | None) -> tuple[str | None, int | None]:
    return (instant.text, instant.unix_ms) if instant else (None, None)


def _money_text(value) -> str | None:
    return None if value is None else decimal_text(value)


def _json_text(value: dict | None) -> str | None:
    return None if value is None else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


# Reading one payment or customer of a site, for GET /api/v1/payments/{id} and
# /api/v1/customers/{id}; callers read them inside Database.snapshot().
_CUSTOMER = statement(
    "SELECT customer_id, email, user_id, visitor_id, name, country, metadata FROM customers"
    " WHERE site_id = ? AND customer_id = ?"
)
_PAYMENT = statement(
    "SELECT payment_id, customer_id, amount, currency, fee, kind, status, paid_at, metadata"
    " FROM payments WHERE site_id = ? AND payment_id = ?"
)
_SUBSCRIPTION = statement(
    "SELECT subscription_id, plan, interval, status, amount, started_at, current_period_end,"
    " canceled_at, ended_at FROM subscription_observations WHERE site_id = ? AND payment_id = ?"
)
_SUCCEEDED_AMOUNTS = statement(
    "SELECT currency, kind, amount FROM payments"
    " WHERE site_id = ? AND customer_id = ? AND status = 'succeeded'"
)


def find_payment(conn: sqlite3.Connection, site_id: int, payment_id: str) -> dict | None:
    """The payment's own fields (amount and fee as Decimal, metadata parsed), or None."""
    row = conn.execute(_PAYMENT, (site_id, payment_id)).fetchone()
    if row is None:
        return None
    return {
        "payment_id": row[0], "customer_id": row[1], "amount": Decimal(row[2]),
        "currency": row[3], "fee": None if row[4] is None else Decimal(row[4]), "kind": row[5],
        "status": row[6], "paid_at": row[7], "metadata": _json_value(row[8]),
    }


def find_customer(conn: sqlite3.Connection, site_id: int, customer_id: str) -> dict | None:
    row = conn.execute(_CUSTOMER, (site_id, customer_id)).fetchone()
    if row is None:
        return None
    return {
        "id": row[0], "email": row[1], "user_id": row[2], "visitor_id": row[3],
        "name": row[4], "country": row[5], "metadata": _json_value(row[6]),
    }


def find_payment_subscription(conn: sqlite3.Connection, site_id: int,
                              payment_id: str) -> dict | None:
    """The subscription block stored with this payment (started_at defaulted), or None."""
    row = conn.execute(_SUBSCRIPTION, (site_id, payment_id)).fetchone()
    if row is None:
        return None
    return {
        "id": row[0], "plan": row[1], "interval": row[2], "status": row[3],
        "amount": None if row[4] is None else Decimal(row[4]),
        "started_at": row[5], "current_period_end": row[6], "canceled_at": row[7],
        "ended_at": row[8],
    }


def succeeded_amounts(conn: sqlite3.Connection, site_id: int,
                      customer_id: str) -> list[tuple[str, str, Decimal]]:
    """(currency, kind, amount) of each succeeded payment of the customer."""
    return [(currency, kind, Decimal(amount)) for currency, kind, amount in
            conn.execute(_SUCCEEDED_AMOUNTS, (site_id, customer_id))]


def _json_value(text: str | None):
    return None if text is None else orjson.loads(text)
