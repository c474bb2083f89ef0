"""A payment's subscription rows after any order of payments re-sent onto other
subscriptions or none: SQLite's writer reads back the observation a payment replaces,
PostgreSQL's reads nothing back; both must leave each subscription a copy of its latest
observation, and a subscription with none left must go."""

from __future__ import annotations

import random

import pytest

from storage.backend import open_database
from storage.payments import PaymentStore
from tests.conftest import WAIT, FakeClock, config_for
from validation.payment import validate_payment

SUBSCRIPTIONS = ("sub_a", "sub_b", "sub_c", None)


def random_payments(seed: int, count: int = 60) -> list:
    rnd = random.Random(seed)
    payments = []
    for _ in range(count):
        body = {"payment_id": f"pay_{rnd.randrange(10)}",
                "customer": {"id": f"cus_{rnd.randrange(3)}"}, "amount": rnd.choice((5, 10, 20)),
                "currency": "USD", "kind": "charge",
                # Few days, so that observations tie on effective_at_ms.
                "paid_at": f"2026-01-{rnd.randrange(1, 5):02d}T09:30:00Z"}
        subscription = rnd.choice(SUBSCRIPTIONS)
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
