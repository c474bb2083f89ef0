"""Payments stored in group transactions (storage/payments.py's GroupCommit, on both
engines): a payment is on disk when its upsert returns, one payment that cannot be stored
fails alone, and the writer's own connection is closed when Tally stops or idles."""

from __future__ import annotations

import threading

import pytest

from app import create_app
from storage import payments as payments_module
from storage.backend import open_database
from storage.db import StorageBusy, StorageError
from storage.payments import PaymentStore, find_payment
from tests.conftest import (
    WAIT,
    FakeClock,
    WriteLock,
    config_for,
    execute,
    fill_postgres_disk,
    free_postgres_disk,
    is_postgres,
    rows,
    wait_until,
)
from tests.realparts import postgres_admin
from validation.payment import validate_payment

GOOD = [f"pay_{n}" for n in range(6)]
BAD = "pay_refused"  # the triggers below spell it out
BAD_LATE = "pay_refused_late"  # refused at its subscription, a payment's last statement
SECOND_SITE = 2  # GOOD[4] is stored for this site, in the group of site 1's payments


def payment(payment_id: str):
    return validate_payment({"payment_id": payment_id, "customer": {"id": f"cus_{payment_id}"},
                             "amount": 10, "currency": "USD", "kind": "charge",
                             "paid_at": "2026-01-31T09:30:00Z",
                             "subscription": {"id": f"sub_{payment_id}", "status": "active"}})


def site_of(payment_id: str) -> int:
    return SECOND_SITE if payment_id == GOOD[4] else 1


def refuse_one_payment(db_path: str) -> None:
    """The database refuses to store BAD (a trigger on its payment row) and BAD_LATE (on
    its subscription row), as it would a row it cannot take."""
    if is_postgres(db_path):
        execute(db_path, "CREATE FUNCTION refuse_payment() RETURNS trigger LANGUAGE plpgsql AS $$"
                         " BEGIN RAISE EXCEPTION 'refused by the test'; END $$")
        execute(db_path, "CREATE TRIGGER refuse_payment BEFORE INSERT ON payments FOR EACH ROW"
                         " WHEN (NEW.payment_id = 'pay_refused') EXECUTE FUNCTION refuse_payment()")
        execute(db_path, "CREATE TRIGGER refuse_subscription BEFORE INSERT ON subscriptions"
                         " FOR EACH ROW WHEN (NEW.subscription_id = 'sub_pay_refused_late')"
                         " EXECUTE FUNCTION refuse_payment()")
    else:
        execute(db_path, "CREATE TRIGGER refuse_payment BEFORE INSERT ON payments"
                         " WHEN NEW.payment_id = 'pay_refused'"
                         " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
        execute(db_path, "CREATE TRIGGER refuse_subscription BEFORE INSERT ON subscriptions"
                         " WHEN NEW.subscription_id = 'sub_pay_refused_late'"
                         " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")


@pytest.fixture
def payments(store):
    """A PaymentStore on `store` (its writer waits WAIT for the write lock), stopped after
    the test."""
    store.busy_timeout_ms = int(WAIT * 1000)
    payments = PaymentStore(store, FakeClock())
    yield payments
    payments.stop(timeout=WAIT)


def upsert_in_threads(payments: PaymentStore, ids: list[str]) -> tuple[list, dict]:
    threads, failures = [], {}

    def upsert(payment_id: str) -> None:
        try:
            payments.upsert(site_of(payment_id), payment(payment_id))
        except StorageError as exc:
            failures[payment_id] = exc

    for payment_id in ids:
        thread = threading.Thread(target=upsert, args=(payment_id,))
        thread.start()
        threads.append(thread)
    return threads, failures


def join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive()


def open_check(db_path: str, conn):
    """A check of whether `conn` is still open: on PostgreSQL, whether the server still has
    its backend; on SQLite, whether the connection still runs a statement."""
    if is_postgres(db_path):
        pid = conn.raw.info.backend_pid
        return lambda: bool(rows(db_path, "SELECT count(*) AS n FROM pg_stat_activity"
                                          " WHERE pid = ?", (pid,))[0]["n"])

    def sqlite_open() -> bool:
        try:
            conn.execute("SELECT 1")
        except Exception:  # sqlite3.ProgrammingError: a closed connection
            return False
        return True

    return sqlite_open


def test_one_bad_payment_fails_alone_and_the_others_are_on_disk(store, db_path, payments):
    refuse_one_payment(db_path)
    execute(db_path, "INSERT INTO sites (id, public_id, account_id, created_at)"
                     " VALUES (2, 'site_b', 1, 0)")
    group = payments.group
    rest = [GOOD[1], BAD, GOOD[2], BAD_LATE, *GOOD[3:]]
    lock = WriteLock(db_path)  # another writer holds the lock while the payments arrive
    try:
        first, first_failures = upsert_in_threads(payments, [GOOD[0]])
        # The writer took the first payment and waits for the lock; the rest queue
        # behind it, and the writer takes them once it holds the lock (PostgreSQL's
        # those of the first payment's site only).
        # (_pid is set with the first payment queued, under the same lock.)
        assert wait_until(lambda: group._pid is not None and not group._waiting)
        assert group.groups == 0
        threads, failures = upsert_in_threads(payments, rest)
        assert wait_until(lambda: len(group._waiting) == len(rest))
        assert all(thread.is_alive() for thread in first + threads)  # none answered yet
    finally:
        lock.release()
    join(first + threads)
    assert not first_failures
    assert sorted(failures) == sorted([BAD, BAD_LATE])
    assert all("refused by the test" in str(failures[p]) for p in (BAD, BAD_LATE))
    assert all(type(failures[p]) is StorageError for p in (BAD, BAD_LATE))
    # SQLite's writer takes all that arrived once it holds the lock: one group.
    # PostgreSQL's, once it holds site 1's lock, site 1's payments: site 2's is the
    # next group, on a new connection (the first group's pipeline failed part way:
    # PostgresConnection.stop_preparing).
    assert group.groups == (2 if is_postgres(db_path) else 1)
    assert group.connections == (2 if is_postgres(db_path) else 1)
    # What each upsert returned for is there for any other connection, and for a new
    # process on the same data.
    reopened = open_database(config_for(db_path))
    with reopened.snapshot() as conn:
        for payment_id in GOOD:
            found = find_payment(conn, site_of(payment_id), payment_id)
            assert found["customer_id"] == f"cus_{payment_id}"
        for payment_id in (BAD, BAD_LATE):
            assert find_payment(conn, 1, payment_id) is None
        stored = conn.execute("SELECT subscription_id FROM subscriptions ORDER BY 1").fetchall()
        customers = conn.execute("SELECT customer_id FROM customers ORDER BY 1").fetchall()
    assert [row[0] for row in stored] == sorted(f"sub_{p}" for p in GOOD)
    assert [row[0] for row in customers] == sorted(f"cus_{p}" for p in GOOD)
    reopened.close()


def test_a_payment_waiting_past_the_busy_timeout_is_refused_busy(store, db_path, payments):
    """A writer that cannot get the lock answers every payment of its group 503 (busy),
    and nothing of them is stored; the next payment is stored once the lock is free."""
    store.busy_timeout_ms = 50
    lock = WriteLock(db_path)
    try:
        threads, failures = upsert_in_threads(payments, GOOD[:3])
        join(threads)
    finally:
        lock.release()
    assert sorted(failures) == GOOD[:3]
    assert all(type(exc).__name__ == "StorageBusy" for exc in failures.values())
    payments.upsert(1, payment(GOOD[3]))
    payments.stop(timeout=WAIT)
    app = create_app(config_for(db_path))  # a restart on the same data
    with app.db.snapshot() as conn:
        assert [find_payment(conn, 1, p) is not None for p in GOOD[:4]] == [False] * 3 + [True]
    app.stop(timeout=5)


def test_after_a_failed_or_refused_payment_the_next_one_on_its_thread_is_stored(
        store, db_path, payments):
    """One thread's payments one after another (a group each): a payment the database
    refuses, then one that cannot get the lock, fail alone; the payments after each are
    stored and reread."""
    refuse_one_payment(db_path)
    store.busy_timeout_ms = 50
    payments.upsert(1, payment(GOOD[0]))
    for refused in (BAD, BAD_LATE):
        with pytest.raises(StorageError, match="refused by the test"):
            payments.upsert(1, payment(refused))
    payments.upsert(1, payment(GOOD[1]))
    lock = WriteLock(db_path)
    try:
        with pytest.raises(StorageBusy):
            payments.upsert(1, payment(GOOD[2]))
    finally:
        lock.release()
    payments.upsert(1, payment(GOOD[3]))
    # On PostgreSQL the connection of each of the three failed groups is replaced
    # (PostgresConnection.stop_preparing); SQLite keeps its one.
    assert payments.group.connections == (4 if is_postgres(db_path) else 1)
    reopened = open_database(config_for(db_path))
    with reopened.snapshot() as conn:
        stored = {payment_id for payment_id in [*GOOD[:4], BAD, BAD_LATE]
                  if find_payment(conn, 1, payment_id) is not None}
        subscriptions = conn.execute("SELECT subscription_id FROM subscriptions ORDER BY 1").fetchall()
    reopened.close()
    assert stored == {GOOD[0], GOOD[1], GOOD[3]}
    assert [row[0] for row in subscriptions] == [f"sub_{p}" for p in (GOOD[0], GOOD[1], GOOD[3])]


def test_the_writers_connection_closes_when_idle_and_when_tally_stops(
        store, db_path, payments, monkeypatch):
    monkeypatch.setattr(payments_module, "IDLE_CLOSE_S", 0.2)
    group = payments.group
    payments.upsert(1, payment(GOOD[0]))
    idle_open = open_check(db_path, group._conn)
    assert idle_open()
    assert wait_until(lambda: group._conn is None)
    assert wait_until(lambda: not idle_open())
    payments.upsert(1, payment(GOOD[1]))  # on a new connection
    assert group.connections == 2
    monkeypatch.setattr(payments_module, "IDLE_CLOSE_S", WAIT)
    app = create_app(config_for(db_path))  # a restart on the same data
    app.payments.upsert(1, payment(GOOD[2]))
    serving_open = open_check(db_path, app.payments.group._conn)
    assert serving_open()
    app.stop(timeout=5)
    assert app.payments.group._conn is None
    assert wait_until(lambda: not serving_open())
    stored = rows(db_path, "SELECT payment_id FROM payments ORDER BY 1")
    assert [row["payment_id"] for row in stored] == GOOD[:3]


def test_a_group_whose_connection_the_server_ended_runs_again_on_a_new_one(
        store, db_path, payments):
    if not is_postgres(db_path):
        pytest.skip("a SQLite connection has no server to end it")
    group = payments.group
    payments.upsert(1, payment(GOOD[0]))
    ended = group._conn.raw.info.backend_pid
    admin = postgres_admin()
    try:
        admin.execute("SELECT pg_terminate_backend(%s)", (ended,))
        assert wait_until(lambda: not admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (ended,)).fetchone()[0])
    finally:
        admin.close()
    threads, failures = upsert_in_threads(payments, GOOD[1:4])
    join(threads)
    assert not failures
    assert group.connections == 2
    stored = rows(db_path, "SELECT payment_id FROM payments ORDER BY 1")
    assert [row["payment_id"] for row in stored] == GOOD[:4]


def test_an_error_psycopg_reads_before_the_items_sync_stays_in_its_savepoint(store, db_path):
    """PostgreSQL's grouped transaction is pipelined: an item's error may be raised while
    the item's later statements are still being sent (the server skips them until the
    Sync). That item alone is rolled back, and the items after it are stored."""
    if not is_postgres(db_path):
        pytest.skip("SQLite's grouped transaction sends no pipeline")
    execute(db_path, "CREATE TABLE group_items (item BIGINT PRIMARY KEY)")

    def write(item: int) -> None:
        conn.execute("INSERT INTO group_items (item) VALUES (?)", (item,))
        if item == 2:
            conn.execute("INSERT INTO group_items (item) VALUES (?)", (1,))  # a duplicate
            for _ in range(500):  # psycopg mostly reads the error while these go out
                conn.execute("SELECT 1")

    conn = store.connect()
    try:
        failures = store.grouped_transaction(conn, [1, 2, 3, 4], write, sites=[1])
    finally:
        conn.close()
    assert [failure is None for failure in failures] == [True, False, True, True]
    assert "group_items_pkey" in str(failures[1])
    stored = rows(db_path, "SELECT item FROM group_items ORDER BY 1")
    assert [row["item"] for row in stored] == [1, 3, 4]


def test_a_group_a_deadlock_ended_runs_again_and_its_payment_is_stored(store, db_path,
                                                                       payments):
    """Another transaction holds the row the writer's payment waits for, then waits for
    the site lock the writer holds: the server ends the writer's transaction (a deadlock),
    which frees the lock, and the writer runs its group again once the other is done."""
    if not is_postgres(db_path):
        pytest.skip("SQLite has one writer: no deadlock between two")
    from storage.postgres import _SITE_LOCKS, SITE_LOCK_KEY

    group = payments.group
    payments.upsert(1, payment(GOOD[0]))
    writer_pid = group._conn.raw.info.backend_pid
    other = store.connect()
    try:
        # Only the writer's deadlock check finds the cycle: it runs first, after 1 s.
        other.raw.execute("SET deadlock_timeout = '600s'")
        other.raw.execute("BEGIN")
        other.raw.execute("SELECT 1 FROM customers WHERE site_id = 1 AND customer_id = %s"
                          " FOR UPDATE", (f"cus_{GOOD[0]}",))
        threads, failures = upsert_in_threads(payments, [GOOD[0]])
        assert wait_until(lambda: rows(
            db_path, "SELECT count(*) AS n FROM pg_locks WHERE pid = ? AND NOT granted",
            (writer_pid,))[0]["n"] == 1)
        other.raw.execute(_SITE_LOCKS, (SITE_LOCK_KEY, [1]))  # granted once the writer's ends
        assert threads[0].is_alive()  # not answered: its group waits to run again
        other.raw.execute("ROLLBACK")
    finally:
        other.close()
    join(threads)
    assert not failures
    # The group ran again on a new connection: one whose pipeline failed part way
    # prepares nothing more (PostgresConnection.stop_preparing) and is replaced.
    assert group.groups == 2 and group.connections == 2
    stored = rows(db_path, "SELECT payment_id FROM payments ORDER BY 1")
    assert [row["payment_id"] for row in stored] == [GOOD[0]]


def test_a_group_of_stored_payments_is_read_back_twice(store, db_path, payments, monkeypatch):
    """PostgreSQL sends a group's locks, every payment's statements and the COMMIT in one
    pipeline and waits for the server's results twice: once the locks are held (then the
    payments that came meanwhile join), and at its end. A payment reads nothing back, so
    none waits on a statement of its own."""
    if not is_postgres(db_path):
        pytest.skip("SQLite's grouped transaction sends no pipeline")
    import psycopg

    waits = []
    sync, leave = psycopg.Pipeline.sync, psycopg.Pipeline.__exit__

    def counted_sync(pipeline):
        waits.append("sync")
        return sync(pipeline)

    def counted_exit(pipeline, *exc):
        waits.append("end" if pipeline.level == 1 else "inner end")
        return leave(pipeline, *exc)

    monkeypatch.setattr(psycopg.Pipeline, "sync", counted_sync)
    monkeypatch.setattr(psycopg.Pipeline, "__exit__", counted_exit)
    group = payments.group
    lock = WriteLock(db_path)  # the payments queue up and go into one group
    try:
        first, _ = upsert_in_threads(payments, [GOOD[0]])
        assert wait_until(lambda: group._pid is not None and not group._waiting)
        threads, failures = upsert_in_threads(payments, GOOD[1:4])
        assert wait_until(lambda: len(group._waiting) == 3)
    finally:
        lock.release()
    join(first + threads)
    assert not failures
    assert group.groups == 1
    assert waits == ["sync", "end"]
    payments.upsert(1, payment(GOOD[0]))  # the same payment again: an update
    assert waits == ["sync", "end"] * 2
    stored = rows(db_path, "SELECT payment_id FROM payments ORDER BY 1")
    assert [row["payment_id"] for row in stored] == GOOD[:4]
    assert len(rows(db_path, "SELECT id FROM subscriptions")) == 4


def test_payments_arriving_while_a_group_waits_for_its_sites_lock_join_it(store, db_path,
                                                                          payments):
    """Another transaction holds the lock of site 1 (on SQLite, the write lock) while the
    writer's group of one site-1 payment waits for it; the site-1 payments that arrive
    meanwhile are stored in that group's transaction. On PostgreSQL a payment of site 2
    arriving meanwhile waits for a group of its own (a second site's lock, taken after
    the first's is held, could deadlock with another writer's); on SQLite, one write lock
    for every site, it joins too."""
    execute(db_path, "INSERT INTO sites (id, public_id, account_id, created_at)"
                     " VALUES (2, 'site_b', 1, 0)")
    postgres = is_postgres(db_path)
    group = payments.group
    if postgres:
        from storage.postgres import _SITE_LOCKS, SITE_LOCK_KEY

        other = store.connect()
        other.raw.execute("BEGIN")
        other.raw.execute(_SITE_LOCKS, (SITE_LOCK_KEY, [1]))
    else:
        other = WriteLock(db_path)
    try:
        first, first_failures = upsert_in_threads(payments, [GOOD[0]])
        assert wait_until(lambda: group._pid is not None and not group._waiting)
        if postgres:  # the writer's backend waits for the site's lock
            assert wait_until(lambda: group._conn is not None and rows(
                db_path, "SELECT count(*) AS n FROM pg_locks WHERE pid = ? AND NOT granted",
                (group._conn.raw.info.backend_pid,))[0]["n"] == 1)
        # GOOD[4] is site 2's (site_of).
        threads, failures = upsert_in_threads(payments, GOOD[1:5])
        assert wait_until(lambda: len(group._waiting) == 4)
        assert all(thread.is_alive() for thread in first + threads)
        assert group.groups == 0
    finally:
        if postgres:
            other.raw.execute("ROLLBACK")
            other.close()
        else:
            other.release()
    join(first + threads)
    assert not first_failures and not failures
    assert group.groups == (2 if postgres else 1)
    stored = rows(db_path, "SELECT payment_id FROM payments ORDER BY 1")
    assert [row["payment_id"] for row in stored] == GOOD[:5]
    if postgres:  # the transaction that wrote each row
        written = {row["payment_id"]: row["xid"] for row in rows(
            db_path, "SELECT payment_id, xmin::text AS xid FROM payments")}
        assert len({written[p] for p in GOOD[:4]}) == 1
        assert written[GOOD[4]] != written[GOOD[0]]


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "not-prepared"])
def test_the_writer_prepares_its_statements_unless_told_not_to(db_path, prepared):
    """The payment writer's connection prepares the statements it runs again and again
    (Config.database_prepared, TALLY_DATABASE_PREPARED); off, it prepares none (PgBouncer
    in transaction mode before 1.21). Either way the payments are stored, and read back
    after a restart."""
    if not is_postgres(db_path):
        pytest.skip("sqlite3 keeps every connection's statements prepared")
    app = create_app(config_for(db_path, database_prepared=prepared))
    account = app.directory.create_account("Prepared", "scale")
    site_id = app.directory.find_site(
        app.directory.create_site(account["id"], ["prepared.test"])["id"]).id
    for payment_id in GOOD:
        app.payments.upsert(site_id, payment(payment_id))
    statements = [row[0] for row in app.payments.group._conn.raw.execute(
        "SELECT statement FROM pg_prepared_statements")]
    app.stop(timeout=5)
    upserts = [text for text in statements if "INSERT INTO payments" in text]
    assert len(upserts) == (1 if prepared else 0)
    app = create_app(config_for(db_path))  # a restart on the same data
    with app.db.snapshot() as conn:
        assert all(find_payment(conn, site_id, p) is not None for p in GOOD)
    app.stop(timeout=5)


def test_tally_database_prepared_is_on_or_off():
    from config import Config, ConfigError

    assert Config.from_env({}).database_prepared is True
    assert Config.from_env({"TALLY_DATABASE_PREPARED": "OFF"}).database_prepared is False
    assert Config.from_env({"TALLY_DATABASE_PREPARED": "on"}).database_prepared is True
    with pytest.raises(ConfigError, match="TALLY_DATABASE_PREPARED must be one of on, off"):
        Config.from_env({"TALLY_DATABASE_PREPARED": "yes"})


@pytest.mark.parametrize("refusals", [1, 2, 3, 4, 5])
def test_a_prepared_writer_stores_payments_after_any_run_of_full_disk_refusals(db_path,
                                                                              refusals):
    """A full disk refuses payments in groups that fail part way through their pipeline,
    run after run; once space returns, every payment is stored (psycopg's record of the
    statements it prepared could go out of step with the server's after such refusals,
    as their timing fell: `prepared statement "_pg3_10" does not exist`, a 500 for a
    payment the database could take). The writer's connection is replaced after such a
    group."""
    if not is_postgres(db_path):
        pytest.skip("sqlite3 prepares nothing by name on the server")
    app = create_app(config_for(db_path))  # prepared statements on: the default
    account = app.directory.create_account("Full", "scale")
    site_id = app.directory.find_site(
        app.directory.create_site(account["id"], ["full.test"])["id"]).id
    refused = [f"pay_full_{n}" for n in range(refusals)]
    try:
        app.payments.upsert(site_id, payment(GOOD[0]))
        fill_postgres_disk(db_path, ("events", "payments"))
        for payment_id in refused:
            with pytest.raises(StorageError, match="No space left on device"):
                app.payments.upsert(site_id, payment(payment_id))
        free_postgres_disk(db_path, ("events", "payments"))
        for payment_id in refused:
            app.payments.upsert(site_id, payment(payment_id))
        assert app.payments.group.connections > 1  # replaced after the refusals
        for payment_id in GOOD[1:]:  # and the new connection prepares again
            app.payments.upsert(site_id, payment(payment_id))
        statements = [row[0] for row in app.payments.group._conn.raw.execute(
            "SELECT statement FROM pg_prepared_statements")]
        assert any("INSERT INTO payments" in text for text in statements)
    finally:
        app.stop(timeout=5)
    app = create_app(config_for(db_path))  # a restart on the same data
    with app.db.snapshot() as conn:
        assert all(find_payment(conn, site_id, p) is not None for p in [*GOOD, *refused])
    app.stop(timeout=5)


def test_a_payment_refused_again_and_again_never_fails_the_next_one(store, db_path, payments):
    """The database refuses one payment each time it comes (a group of its own, failing
    part way); the payment after each refusal is stored, however many refusals came
    before, and all are there after a restart."""
    refuse_one_payment(db_path)
    stored = [f"pay_next_{n}" for n in range(6)]
    for payment_id in stored:
        with pytest.raises(StorageError, match="refused by the test"):
            payments.upsert(1, payment(BAD))
        payments.upsert(1, payment(payment_id))
    payments.stop(timeout=WAIT)
    app = create_app(config_for(db_path))
    with app.db.snapshot() as conn:
        assert all(find_payment(conn, 1, p) is not None for p in stored)
        assert find_payment(conn, 1, BAD) is None
    app.stop(timeout=5)


# Indexes whose only key a payment's lookups share is site_id: reading a payment's rows
# through one reads every row of the site.
SITE_WIDE_INDEXES = ("customers_user", "customers_visitor", "payments_paid", "payments_customer",
                     "subscription_observations_time", "subscriptions_customer")


# ?1 the site, ?2 how many rows.
_GROWN_ROWS = (
    "INSERT INTO customers (site_id, customer_id, as_of_ms, created_at, updated_at)"
    " SELECT ?1, 'cus_b' || g, 0, 0, 0 FROM generate_series(1, ?2) g",
    "INSERT INTO payments (site_id, payment_id, customer_id, amount, currency, kind, status,"
    " paid_at, paid_at_ms, created_at, updated_at) SELECT ?1, 'pay_b' || g, 'cus_b' || g, '10',"
    " 'USD', 'charge', 'succeeded', '2026-01-31T09:30:00Z', 1769851800000, 0, 0"
    " FROM generate_series(1, ?2) g",
    "INSERT INTO subscription_observations (site_id, payment_id, subscription_id, customer_id,"
    " effective_at_ms, currency, status, started_at, started_at_ms, received_at)"
    " SELECT ?1, 'pay_b' || g, 'sub_b' || g, 'cus_b' || g, 1769851800000, 'USD', 'active',"
    " '2026-01-31T09:30:00Z', 1769851800000, 0 FROM generate_series(1, ?2) g",
    "INSERT INTO subscriptions (site_id, payment_id, subscription_id, customer_id,"
    " effective_at_ms, currency, status, started_at, started_at_ms, updated_at)"
    " SELECT ?1, 'pay_b' || g, 'sub_b' || g, 'cus_b' || g, 1769851800000, 'USD', 'active',"
    " '2026-01-31T09:30:00Z', 1769851800000, 0 FROM generate_series(1, ?2) g",
)


def grow_payment_tables(db_path: str, site_id: int, count: int) -> None:
    """`count` more customers, payments, observations and subscriptions of the site, written
    by SQL of the test's own."""
    for sql in _GROWN_ROWS:
        execute(db_path, sql, (site_id, count))


def test_the_writer_plans_again_once_the_tables_grew(db_path, monkeypatch):
    """The writer's statements and the foreign keys' checks on its connection are planned
    by their first runs, here on empty tables without statistics (as on a server without
    autovacuum), where an index on site_id alone looks as good as a row's key. Once the
    payments the writer stored have doubled past REPLAN_FIRST it plans again, on the tables
    as they are: thousands of rows, so a payment (a resent one, a new one on a known
    customer and subscription) reads its rows by their keys, none through such an index."""
    if not is_postgres(db_path):
        pytest.skip("SQLite plans each statement when it is prepared, on the data it holds")
    monkeypatch.setattr(payments_module, "REPLAN_FIRST", 16)
    app = create_app(config_for(db_path))
    account = app.directory.create_account("Plans", "scale")
    site_id = app.directory.find_site(
        app.directory.create_site(account["id"], ["plans.test"])["id"]).id

    def pay(n: int):
        return validate_payment({
            "payment_id": f"pay_{n}", "customer": {"id": f"cus_{n % 5}"}, "amount": 10,
            "currency": "USD", "kind": "charge", "paid_at": "2026-01-31T09:30:00Z",
            "metadata": {"n": str(n)}, "subscription": {"id": f"sub_{n % 4}", "status": "active"}})

    def site_wide_scans() -> int:
        # The writer's backend reports its counts when it next goes idle (now, forced).
        app.payments.group._conn.raw.execute("SELECT pg_stat_force_next_flush()")
        return sum(row["idx_scan"] for row in rows(
            db_path, "SELECT indexrelname, idx_scan FROM pg_stat_user_indexes"
                     " WHERE schemaname = current_schema()")
                   if row["indexrelname"] in SITE_WIDE_INDEXES)

    try:
        for n in range(12):
            app.payments.upsert(site_id, pay(n))
        grow_payment_tables(db_path, site_id, 3000)
        for n in range(12, 24):
            app.payments.upsert(site_id, pay(n))
        before = site_wide_scans()
        for n in (*range(10), *range(24, 34)):
            app.payments.upsert(site_id, pay(n))
        assert site_wide_scans() == before
        assert rows(db_path, "SELECT count(*) AS n FROM payments")[0]["n"] == 3034
    finally:
        app.stop(timeout=5)
