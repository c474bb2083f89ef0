"""A payment's subscription block as stored, on both engines (PostgreSQL writes it in one
statement, SQLite in five: storage/payments.py): whatever a run of payments does (new,
resent, moved to another subscription, their block dropped, refused), each payment with a
block has one observation, and each subscription row is a copy of its subscription's
latest observation, with no row for a subscription nothing observes any more. The same
holds for payments written one after another in any order, and for a whole group written
in one transaction."""

from __future__ import annotations

import random
import threading

import pytest

from storage.backend import open_database
from storage.db import StorageError
from storage.payments import SUBSCRIPTION_STATE, PaymentStore
from tests.conftest import WAIT, FakeClock, config_for, execute, is_postgres, rows
from validation.payment import validate_payment

PAYMENTS = [f"pay_{n}" for n in range(8)]
SUBSCRIPTIONS = ["sub_a", "sub_b", "sub_c"]
STATUSES = ["active", "past_due", "canceled", "trialing"]
REFUSED = "pay_refused"


def body(payment_id: str, subscription: str | None, day: int, status: str = "active",
         amount: int = 10) -> dict:
    block = None if subscription is None else {
        "id": subscription, "status": status, "amount": amount, "plan": f"plan_{amount}"}
    return {"payment_id": payment_id, "customer": {"id": f"cus_{payment_id[-1]}"},
            "amount": amount, "currency": "USD", "kind": "charge",
            "paid_at": f"2026-01-{day:02d}T09:30:00Z",
            **({"subscription": block} if block else {})}


@pytest.fixture
def payments(store):
    store.busy_timeout_ms = int(WAIT * 1000)
    payments = PaymentStore(store, FakeClock())
    yield payments
    payments.stop(timeout=WAIT)


def upsert_together(payments: PaymentStore, bodies: list[dict]) -> dict[str, Exception]:
    """The payments from a thread each, so the writer takes several in one group."""
    failures: dict[str, Exception] = {}

    def upsert(one: dict) -> None:
        try:
            payments.upsert(1, validate_payment(one))
        except StorageError as exc:
            failures[one["payment_id"]] = exc

    threads = [threading.Thread(target=upsert, args=(one,)) for one in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive()
    return failures


def assert_consistent(db_path: str, written: dict[str, dict]) -> None:
    """Observations match the payments' last blocks; subscriptions their latest observation."""
    observed = rows(db_path, "SELECT payment_id, subscription_id, status"
                             " FROM subscription_observations ORDER BY payment_id")
    assert observed == [
        {"payment_id": payment_id, "subscription_id": one["subscription"]["id"],
         "status": one["subscription"]["status"]}
        for payment_id, one in sorted(written.items()) if "subscription" in one]
    columns = ", ".join(SUBSCRIPTION_STATE)
    latest = rows(db_path, f"SELECT {columns} FROM subscription_observations o"  # noqa: S608 - fixed columns
                           " WHERE NOT EXISTS (SELECT 1 FROM subscription_observations n"
                           "  WHERE n.site_id = o.site_id AND n.subscription_id = o.subscription_id"
                           "  AND (n.effective_at_ms > o.effective_at_ms OR"
                           "   (n.effective_at_ms = o.effective_at_ms AND n.id > o.id)))"
                           " ORDER BY subscription_id")
    stored = rows(db_path, f"SELECT {columns} FROM subscriptions ORDER BY subscription_id")  # noqa: S608 - fixed columns
    assert stored == latest


def test_subscriptions_follow_their_latest_observation_through_moves_and_drops(
        store, db_path, payments):
    rnd = random.Random(29)
    written: dict[str, dict] = {}
    reopened = None
    for round_ in range(12):
        bodies = {}
        for payment_id in rnd.sample(PAYMENTS, rnd.randint(1, 5)):
            subscription = rnd.choice([*SUBSCRIPTIONS, None])
            bodies[payment_id] = body(payment_id, subscription, rnd.randint(1, 4),
                                      rnd.choice(STATUSES), rnd.choice([10, 20]))
        assert upsert_together(payments, list(bodies.values())) == {}
        written.update(bodies)
        assert_consistent(db_path, written)
        if round_ == 5:
            # A new process on the data written so far goes on from it.
            payments.stop(timeout=WAIT)
            reopened = open_database(config_for(db_path))
            reopened.busy_timeout_ms = int(WAIT * 1000)
            payments = PaymentStore(reopened, FakeClock())
    payments.stop(timeout=WAIT)
    reopened.close()


def test_a_subscription_nothing_observes_any_more_goes_when_its_payment_moves(store, db_path,
                                                                                payments):
    payments.upsert(1, validate_payment(body("pay_1", "sub_a", 1)))
    payments.upsert(1, validate_payment(body("pay_2", "sub_b", 2)))
    payments.upsert(1, validate_payment(body("pay_1", "sub_b", 3, "canceled")))
    assert rows(db_path, "SELECT subscription_id, status, payment_id FROM subscriptions") == [
        {"subscription_id": "sub_b", "status": "canceled", "payment_id": "pay_1"}]
    payments.upsert(1, validate_payment(body("pay_1", None, 3)))
    assert rows(db_path, "SELECT subscription_id, status, payment_id FROM subscriptions") == [
        {"subscription_id": "sub_b", "status": "active", "payment_id": "pay_2"}]
    payments.upsert(1, validate_payment(body("pay_2", "sub_c", 2)))
    assert rows(db_path, "SELECT subscription_id, payment_id FROM subscriptions") == [
        {"subscription_id": "sub_c", "payment_id": "pay_2"}]


def test_of_two_observations_at_one_instant_the_one_written_last_is_the_subscription(
        store, db_path, payments):
    payments.upsert(1, validate_payment(body("pay_1", "sub_a", 1, "active")))
    payments.upsert(1, validate_payment(body("pay_2", "sub_a", 1, "past_due")))
    assert rows(db_path, "SELECT status FROM subscriptions") == [{"status": "past_due"}]
    payments.upsert(1, validate_payment(body("pay_1", "sub_a", 1, "active")))
    assert rows(db_path, "SELECT status, payment_id FROM subscriptions") == [
        {"status": "active", "payment_id": "pay_1"}]


def test_a_refused_payment_in_a_group_of_moves_leaves_the_others_and_its_own_state(
        store, db_path, payments):
    for payment_id, subscription in (("pay_1", "sub_a"), ("pay_2", "sub_a"), ("pay_3", "sub_b"),
                                     (REFUSED, "sub_c")):
        payments.upsert(1, validate_payment(body(payment_id, subscription, 1)))
    if is_postgres(db_path):
        execute(db_path, "CREATE FUNCTION refuse_payment() RETURNS trigger LANGUAGE plpgsql AS $$"
                         " BEGIN RAISE EXCEPTION 'refused by the test'; END $$")
        execute(db_path, "CREATE TRIGGER refuse_observation BEFORE INSERT ON"
                         " subscription_observations FOR EACH ROW"
                         " WHEN (NEW.payment_id = 'pay_refused') EXECUTE FUNCTION refuse_payment()")
    else:
        execute(db_path, "CREATE TRIGGER refuse_observation BEFORE INSERT ON"
                         " subscription_observations WHEN NEW.payment_id = 'pay_refused'"
                         " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    moves = [body("pay_1", "sub_b", 2, "past_due"), body(REFUSED, "sub_a", 3),
             body("pay_3", None, 2), body("pay_2", "sub_c", 2, "canceled")]
    failures = upsert_together(payments, moves)
    assert list(failures) == [REFUSED]
    assert "refused by the test" in str(failures[REFUSED])
    # The refused payment keeps its old block (sub_c) and nothing of its move is stored.
    assert rows(db_path, "SELECT payment_id, subscription_id FROM subscription_observations"
                         " ORDER BY payment_id") == [
        {"payment_id": "pay_1", "subscription_id": "sub_b"},
        {"payment_id": "pay_2", "subscription_id": "sub_c"},
        {"payment_id": REFUSED, "subscription_id": "sub_c"}]
    assert rows(db_path, "SELECT subscription_id, status, payment_id FROM subscriptions"
                         " ORDER BY subscription_id") == [
        {"subscription_id": "sub_b", "status": "past_due", "payment_id": "pay_1"},
        {"subscription_id": "sub_c", "status": "canceled", "payment_id": "pay_2"}]
    # The writer goes on after the refusal (on PostgreSQL with a new connection).
    payments.upsert(1, validate_payment(body("pay_4", "sub_a", 4)))
    assert rows(db_path, "SELECT subscription_id FROM subscriptions ORDER BY 1") == [
        {"subscription_id": "sub_a"}, {"subscription_id": "sub_b"}, {"subscription_id": "sub_c"}]


# Payments one after another, in a random order, against a model of what they leave.
SUBSCRIPTIONS_OR_NONE = ("sub_a", "sub_b", "sub_c", None)


def random_payments(seed: int, count: int = 60) -> list:
    rnd = random.Random(seed)
    payments = []
    for _ in range(count):
        body = {"payment_id": f"pay_{rnd.randrange(10)}",
                "customer": {"id": f"cus_{rnd.randrange(3)}"}, "amount": rnd.choice((5, 10, 20)),
                "currency": "USD", "kind": "charge",
                # Few days, so that observations tie on effective_at_ms.
                "paid_at": f"2026-01-{rnd.randrange(1, 5):02d}T09:30:00Z"}
        subscription = rnd.choice(SUBSCRIPTIONS_OR_NONE)
        if subscription is not None:
            body["subscription"] = {"id": subscription,
                                    "status": rnd.choice(("active", "canceled", "past_due"))}
        payments.append(validate_payment(body))
    return payments


def expected(payments: list) -> tuple[list[tuple], list[tuple]]:
    """(subscriptions, observations) as (subscription_id, status, payment_id), sorted: each
    payment's latest subscription block, and each subscription's latest observation (by
    paid_at, then the later written)."""
    observed: dict[str, tuple] = {}
    for order, payment in enumerate(payments):
        observed.pop(payment.payment_id, None)  # re-sent: its observation is written anew
        if payment.subscription is not None:
            observed[payment.payment_id] = (payment.paid_at.unix_ms, order, payment.subscription.id,
                                            payment.subscription.status, payment.payment_id)
    latest: dict[str, tuple] = {}
    for observation in observed.values():
        subscription = observation[2]
        if subscription not in latest or observation[:2] > latest[subscription][:2]:
            latest[subscription] = observation
    return (sorted(o[2:] for o in latest.values()), sorted(o[2:] for o in observed.values()))


def stored(db) -> tuple[list[tuple], list[tuple]]:
    with db.snapshot() as conn:
        subscriptions = conn.execute(
            "SELECT subscription_id, status, payment_id FROM subscriptions").fetchall()
        observations = conn.execute(
            "SELECT subscription_id, status, payment_id FROM subscription_observations").fetchall()
    return sorted(map(tuple, subscriptions)), sorted(map(tuple, observations))


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_subscriptions_follow_their_latest_observation_whatever_the_order(store, db_path, seed):
    payments = random_payments(seed)
    writer = PaymentStore(store, FakeClock())
    store.busy_timeout_ms = int(WAIT * 1000)
    try:
        for payment in payments:
            writer.upsert(1, payment)
    finally:
        writer.stop(timeout=WAIT)
    assert stored(store) == expected(payments)
    # And as a new process reads them.
    reopened = open_database(config_for(db_path))
    try:
        assert stored(reopened) == expected(payments)
    finally:
        reopened.close()


def test_a_group_written_at_once_moves_subscriptions_as_one_by_one(store, db_path):
    """Payments of one group, in one transaction without a SAVEPOINT each, leave the rows
    that one transaction a payment would."""
    payments = random_payments(7)
    with store.transaction() as conn:
        for payment in payments:
            PaymentStore.write(conn, 1, payment, 1_790_000_000_000)
    assert stored(store) == expected(payments)
