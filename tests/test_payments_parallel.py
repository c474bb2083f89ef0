"""Payment writers of one site side by side (two workers or hosts: a GroupCommit each, on
connections of their own). On PostgreSQL they hold the site's lock shared and serialize
by payment, customer and subscription (storage/payments.py lock_payments), while the
flush still excludes them all; on SQLite one writer at a time. Either way the rows are
those of the payments written one after another: the same payment re-sent by both onto
different subscriptions, customers and subscriptions shared in opposite orders, first
touches while the site's flush writes sessions and links."""

from __future__ import annotations

import random
import threading

import pytest

from storage.backend import open_database
from storage.payments import PaymentStore, lock_payments
from storage.sessions import (
    defined_first_touches,
    first_touch_of_new_sessions,
    stored_first_touches,
)
from tests.conftest import WAIT, FakeClock, WriteLock, config_for, is_postgres, rows, wait_until
from tests.test_payments_subscriptions import expected, stored
from validation.payment import validate_payment

NOW_MS = 1_790_000_000_000


def payment(payment_id: str, customer: str, subscription: str | None, day: int = 1,
            amount: int = 10, status: str = "active", **linked):
    body = {"payment_id": payment_id, "customer": {"id": customer, **linked},
            "amount": amount, "currency": "USD", "kind": "charge",
            "paid_at": f"2026-01-{day:02d}T09:30:00Z"}
    if subscription is not None:
        body["subscription"] = {"id": subscription, "status": status}
    return validate_payment(body)


def writer(db) -> PaymentStore:
    db.busy_timeout_ms = int(WAIT * 1000)
    return PaymentStore(db, FakeClock())


def in_thread(store: PaymentStore, site_id: int, one) -> tuple[threading.Thread, list]:
    failures: list = []

    def upsert() -> None:
        try:
            store.upsert(site_id, one)
        except Exception as exc:  # the test asserts there is none
            failures.append(exc)

    thread = threading.Thread(target=upsert)
    thread.start()
    return thread, failures


def finished(thread: threading.Thread, failures: list) -> None:
    thread.join(WAIT)
    assert not thread.is_alive()
    assert not failures, failures


def waits_for_a_lock(db_path: str, conn) -> bool:
    return rows(db_path, "SELECT count(*) AS n FROM pg_locks WHERE pid = ? AND NOT granted",
                (conn.raw.info.backend_pid,))[0]["n"] > 0


def test_a_site_s_second_payment_writer_commits_while_the_first_s_group_is_open(
        store, db_path):
    if not is_postgres(db_path):
        pytest.skip("SQLite has one writer: the second waits for the first's COMMIT")
    first = store.connect()
    second = writer(store)
    flush_conn = store.connect()
    try:
        # A group of the first writer, written and not committed: its site lock shared.
        held = payment("pay_0", "cus_0", "sub_0", day=2)
        first.begin_sites([1], shared=True)
        lock_payments(first, [(1, held)])
        PaymentStore.write(first, 1, held, NOW_MS)

        # Another payment of the site is answered meanwhile; one of the same subscription
        # waits for that group, whose observation it must see.
        second.upsert(1, payment("pay_1", "cus_1", "sub_1"))
        same_subscription = in_thread(second, 1, payment("pay_2", "cus_2", "sub_0", day=1))
        assert wait_until(lambda: second.group._conn is not None
                          and waits_for_a_lock(db_path, second.group._conn))
        assert same_subscription[0].is_alive()
        first.commit()
        finished(*same_subscription)
        assert rows(db_path, "SELECT subscription_id, payment_id FROM subscriptions"
                             " ORDER BY 1") == [{"subscription_id": "sub_0", "payment_id": "pay_0"},
                                                {"subscription_id": "sub_1", "payment_id": "pay_1"}]

        # The flush excludes both: it waits for the open group, and a payment group that
        # comes after it waits for the flush (queued behind its exclusive request).
        held = payment("pay_3", "cus_3", "sub_3")
        first.begin_sites([1], shared=True)
        lock_payments(first, [(1, held)])
        PaymentStore.write(first, 1, held, NOW_MS)
        flushing, done_flushing = threading.Event(), threading.Event()

        def flush() -> None:
            with store.transaction(flush_conn, sites=[1]):
                flushing.set()
                done_flushing.wait(WAIT)

        flusher = threading.Thread(target=flush)
        flusher.start()
        assert wait_until(lambda: waits_for_a_lock(db_path, flush_conn))
        after_flush = in_thread(second, 1, payment("pay_4", "cus_4", "sub_4"))
        assert wait_until(lambda: waits_for_a_lock(db_path, second.group._conn))
        assert not flushing.is_set() and after_flush[0].is_alive()
        first.commit()
        assert flushing.wait(WAIT)
        assert waits_for_a_lock(db_path, second.group._conn) and after_flush[0].is_alive()
        done_flushing.set()
        flusher.join(WAIT)
        assert not flusher.is_alive()
        finished(*after_flush)
    finally:
        first.close()
        flush_conn.close()
        second.stop(timeout=WAIT)
    stored_ids = [r["payment_id"] for r in rows(db_path, "SELECT payment_id FROM payments"
                                                         " ORDER BY 1")]
    assert stored_ids == [f"pay_{n}" for n in range(5)]
    # A new process goes on from the rows written.
    reopened = open_database(config_for(db_path))
    again = writer(reopened)
    try:
        again.upsert(1, payment("pay_0", "cus_0", "sub_1", day=3))
    finally:
        again.stop(timeout=WAIT)
        reopened.close()
    # pay_0 moves to sub_1 (the later payment there); sub_0 is left pay_2's.
    assert rows(db_path, "SELECT subscription_id, payment_id FROM subscriptions ORDER BY 1") == [
        {"subscription_id": "sub_0", "payment_id": "pay_2"},
        {"subscription_id": "sub_1", "payment_id": "pay_0"},
        {"subscription_id": "sub_3", "payment_id": "pay_3"},
        {"subscription_id": "sub_4", "payment_id": "pay_4"}]


def queue_up(store: PaymentStore, payments: list) -> list[tuple[threading.Thread, list]]:
    """The payments to `store`'s writer, arriving in this order (the first taken alone,
    the others waiting while it waits for the lock the test holds)."""
    group = store.group
    started = [in_thread(store, 1, payments[0])]
    assert wait_until(lambda: group._pid is not None and not group._waiting)
    for count, one in enumerate(payments[1:], 1):
        started.append(in_thread(store, 1, one))
        assert wait_until(lambda count=count: len(group._waiting) == count)
    return started


SUBSCRIPTIONS = ("sub_a", "sub_b", "sub_c", None)


def round_of(rnd: random.Random, ids: list[str], amount: int) -> list:
    return [payment(payment_id, f"cus_{rnd.randrange(4)}", rnd.choice(SUBSCRIPTIONS),
                    day=rnd.randrange(1, 4), amount=amount,
                    status=rnd.choice(("active", "canceled", "past_due")))
            for payment_id in ids]


@pytest.mark.parametrize("seed", [1, 2])
def test_two_writers_resending_payments_in_opposite_orders_leave_the_models_rows(
        store, db_path, seed):
    """Each round, both writers get the same payment ids (onto subscriptions drawn for
    each), in opposite orders, as one group each: whichever of the two writes of a
    payment came last, the rows are those of the model over that order."""
    rnd = random.Random(seed)
    writers = [writer(store), writer(store)]
    history: list = []
    try:
        for round_ in range(6):
            ids = [f"pay_{n}" for n in rnd.sample(range(8), 5)]
            sent = [round_of(rnd, ids, 10), round_of(rnd, ids[::-1], 20)]
            gate = WriteLock(db_path)
            try:
                threads = [queue_up(one, payments) for one, payments in zip(writers, sent, strict=True)]
            finally:
                gate.release()
            for one in threads:
                for started in one:
                    finished(*started)
            # The write that came last of each payment is the one its row holds; those
            # came after the others, and in the order of their observations' ids.
            amounts = {r["payment_id"]: r["amount"] for r in rows(
                db_path, "SELECT payment_id, amount FROM payments")}
            won = {p.payment_id: p for p in [*sent[0], *sent[1]]
                   if str(p.amount) == amounts[p.payment_id]}
            assert set(won) == set(ids)
            lost = [p for p in [*sent[0], *sent[1]] if won[p.payment_id] is not p]
            observed = {r["payment_id"]: r["id"] for r in rows(
                db_path, "SELECT payment_id, id FROM subscription_observations")}
            history += lost + sorted(won.values(),
                                     key=lambda p: observed.get(p.payment_id, 0))
            assert stored(store) == expected(history), round_
        if is_postgres(db_path):
            # No group of either writer was ended by a deadlock (it would have run again
            # on a new connection).
            assert [one.group.connections for one in writers] == [1, 1]
    finally:
        for one in writers:
            one.stop(timeout=WAIT)
    reopened = open_database(config_for(db_path))
    try:
        assert stored(reopened) == expected(history)
    finally:
        reopened.close()


def test_first_touches_stay_as_defined_while_payments_and_the_flush_of_the_site_race(
        store, db_path):
    """The site's flush (its sessions, links and $identify links, under the site's lock
    as ingest/flusher.py takes it) and two payment writers (their customers, linked by
    user id and visitor id) at once: first touch is its definition, row by row."""
    rnd = random.Random(29)
    writers = [writer(store), writer(store)]
    flush_conn = store.connect()
    failures: list = []

    def flush() -> None:
        try:
            for session in range(1, 41):
                started = NOW_MS + rnd.randrange(0, 20) * 60_000
                visitor = rnd.randrange(1, 9)
                with store.transaction(flush_conn, sites=[1]) as conn:
                    conn.execute("INSERT INTO sessions (id, site_id, visitor_id, started_at,"
                                 " last_seen_at, channel) VALUES (?, 1, ?, ?, ?, 'Direct')",
                                 (session, visitor, started, started + 60_000))
                    first_touch_of_new_sessions(conn, [(1, visitor)])
                    if session % 3 == 0:
                        conn.execute("INSERT INTO visitor_identities (site_id, uid, visitor_id,"
                                     " linked_at) VALUES (1, ?, ?, ?) ON CONFLICT DO NOTHING",
                                     (f"u{rnd.randrange(4)}", rnd.randrange(1, 9), NOW_MS))
        except Exception as exc:  # the test asserts there is none
            failures.append(exc)

    def pay(number: int) -> None:
        for n in range(20):
            customer = (number * 20 + n) % 12
            try:
                writers[number].upsert(1, payment(
                    f"pay_{number}_{n}", f"cus_{customer}", f"sub_{customer}",
                    user_id=f"u{(customer + n) % 5}", visitor_id=str((customer + n) % 9 + 1)))
            except Exception as exc:  # the test asserts there is none
                failures.append(exc)

    threads = [threading.Thread(target=flush),
               *(threading.Thread(target=pay, args=(n,)) for n in range(2))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
            assert not thread.is_alive()
    finally:
        flush_conn.close()
        for one in writers:
            one.stop(timeout=WAIT)
    assert not failures, failures[:3]
    conn = store.conn()
    touches = stored_first_touches(conn)
    assert touches == defined_first_touches(conn)
    assert len(touches) == 12 and any(session is not None for *_, session in touches)
    reopened = open_database(config_for(db_path))
    try:
        conn = reopened.conn()
        assert stored_first_touches(conn) == defined_first_touches(conn) == touches
    finally:
        reopened.close()
