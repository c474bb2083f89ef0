"""Payments stored in group transactions (storage/payments.py's GroupCommit on SQLite; a
transaction each on PostgreSQL): a payment is on disk when its upsert returns, and one
payment that cannot be stored fails alone."""

from __future__ import annotations

import threading

import pytest

from app import create_app
from storage.backend import open_database
from storage.db import StorageBusy, StorageError
from storage.payments import PaymentStore, find_payment
from tests.conftest import WAIT, FakeClock, WriteLock, config_for, execute, is_postgres, wait_until
from validation.payment import validate_payment

GOOD = [f"pay_{n}" for n in range(6)]
BAD = "pay_refused"  # the triggers below spell it out


def payment(payment_id: str):
    return validate_payment({"payment_id": payment_id, "customer": {"id": f"cus_{payment_id}"},
                             "amount": 10, "currency": "USD", "kind": "charge",
                             "paid_at": "2026-01-31T09:30:00Z",
                             "subscription": {"id": f"sub_{payment_id}", "status": "active"}})


def refuse_one_payment(db_path: str) -> None:
    """The database refuses to store BAD (a trigger), as it would a row it cannot take."""
    if is_postgres(db_path):
        execute(db_path, "CREATE FUNCTION refuse_payment() RETURNS trigger LANGUAGE plpgsql AS $$"
                         " BEGIN RAISE EXCEPTION 'refused by the test'; END $$")
        execute(db_path, "CREATE TRIGGER refuse_payment BEFORE INSERT ON payments FOR EACH ROW"
                         " WHEN (NEW.payment_id = 'pay_refused') EXECUTE FUNCTION refuse_payment()")
    else:
        execute(db_path, "CREATE TRIGGER refuse_payment BEFORE INSERT ON payments"
                         " WHEN NEW.payment_id = 'pay_refused'"
                         " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")


def upsert_in_threads(payments: PaymentStore, ids: list[str]) -> tuple[list, dict]:
    threads, failures = [], {}

    def upsert(payment_id: str) -> None:
        try:
            payments.upsert(1, payment(payment_id))
        except StorageError as exc:
            failures[payment_id] = exc

    for payment_id in ids:
        thread = threading.Thread(target=upsert, args=(payment_id,))
        thread.start()
        threads.append(thread)
    return threads, failures


def test_one_bad_payment_fails_alone_and_the_others_are_on_disk(store, db_path):
    refuse_one_payment(db_path)
    store.busy_timeout_ms = int(WAIT * 1000)  # the writer waits out the lock held below
    payments = PaymentStore(store, FakeClock())
    group = payments.group
    assert (group is None) == is_postgres(db_path)
    rest = [*GOOD[1:3], BAD, *GOOD[3:]]
    if group is None:
        first, first_failures = upsert_in_threads(payments, [GOOD[0]])
        threads, failures = upsert_in_threads(payments, rest)
    else:
        lock = WriteLock(db_path)  # another writer holds the lock while the payments arrive
        try:
            first, first_failures = upsert_in_threads(payments, [GOOD[0]])
            # The writer took the first payment and waits for the lock; the rest queue
            # behind it and go into the next transaction together.
            # (_pid is set with the first payment queued, under the same lock.)
            assert wait_until(lambda: group._pid is not None and not group._waiting)
            assert group.groups == 0
            threads, failures = upsert_in_threads(payments, rest)
            assert wait_until(lambda: len(group._waiting) == len(rest))
            assert all(thread.is_alive() for thread in first + threads)  # none answered yet
        finally:
            lock.release()
    for thread in first + threads:
        thread.join(WAIT)
        assert not thread.is_alive()
    assert not first_failures
    assert list(failures) == [BAD]
    assert "refused by the test" in str(failures[BAD])
    if group is not None:
        assert group.groups == 2  # the first payment's, then all the rest's
    # What each upsert returned for is there for any other connection, and for a new
    # process on the same data.
    reopened = open_database(config_for(db_path))
    with reopened.snapshot() as conn:
        for payment_id in GOOD:
            assert find_payment(conn, 1, payment_id)["customer_id"] == f"cus_{payment_id}"
        assert find_payment(conn, 1, BAD) is None
        stored = conn.execute("SELECT subscription_id FROM subscriptions ORDER BY 1").fetchall()
    assert [row[0] for row in stored] == sorted(f"sub_{p}" for p in GOOD)
    reopened.close()


@pytest.mark.sqlite_only
def test_a_payment_waiting_past_the_busy_timeout_is_refused_busy(store, db_path):
    """A writer that cannot get the lock answers every payment of its group 503 (busy),
    and nothing of them is stored; the next payment is stored once the lock is free."""
    store.busy_timeout_ms = 50
    payments = PaymentStore(store, FakeClock())
    lock = WriteLock(db_path)
    try:
        threads, failures = upsert_in_threads(payments, GOOD[:3])
        for thread in threads:
            thread.join(WAIT)
    finally:
        lock.release()
    assert sorted(failures) == GOOD[:3]
    assert all(type(exc).__name__ == "StorageBusy" for exc in failures.values())
    payments.upsert(1, payment(GOOD[3]))
    app = create_app(config_for(db_path))  # a restart on the same file
    with app.db.snapshot() as conn:
        assert [find_payment(conn, 1, p) is not None for p in GOOD[:4]] == [False] * 3 + [True]
    app.stop(timeout=5)


def test_after_a_failed_or_refused_payment_the_next_one_on_its_thread_is_stored(store, db_path):
    """One thread's payments one after another (on PostgreSQL one pooled connection, each
    payment pipelined from BEGIN to COMMIT): a payment the database refuses, then one that
    cannot get the lock, fail alone; the payments after each are stored and reread."""
    refuse_one_payment(db_path)
    store.busy_timeout_ms = 50
    payments = PaymentStore(store, FakeClock())
    payments.upsert(1, payment(GOOD[0]))
    with pytest.raises(StorageError, match="refused by the test"):
        payments.upsert(1, payment(BAD))
    payments.upsert(1, payment(GOOD[1]))
    lock = WriteLock(db_path)
    try:
        with pytest.raises(StorageBusy):
            payments.upsert(1, payment(GOOD[2]))
    finally:
        lock.release()
    payments.upsert(1, payment(GOOD[3]))
    reopened = open_database(config_for(db_path))
    with reopened.snapshot() as conn:
        stored = {payment_id for payment_id in [*GOOD[:4], BAD]
                  if find_payment(conn, 1, payment_id) is not None}
        subscriptions = conn.execute("SELECT subscription_id FROM subscriptions ORDER BY 1").fetchall()
    reopened.close()
    assert stored == {GOOD[0], GOOD[1], GOOD[3]}
    assert [row[0] for row in subscriptions] == [f"sub_{p}" for p in (GOOD[0], GOOD[1], GOOD[3])]
