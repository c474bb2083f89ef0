"""The SQL behind MRR and its movements gives what the in-memory model gives, on any data.

Payments go through the real validator and store (storage/payments.py); the reports read
them back with reports.money.queries (one seek per subscription, only changed subscriptions
re-read, first-touch screening of arrivals) and, for comparison, with the plain in-memory
SubscriptionHistory built from every stored row.
"""

from __future__ import annotations

import itertools
from contextlib import ExitStack
from datetime import date
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reports.money import queries
from reports.money.mrr import (
    Observation,
    SubscriptionHistory,
    SubscriptionPayment,
    mrr_at,
    mrr_movements,
)
from reports.shared.params import DateRange
from storage.db import Database
from storage.directory import Directory
from storage.payments import PaymentStore
from storage.postgres import PostgresDatabase
from tests.conftest import BACKENDS, FakeClock, counting_bytes, new_postgres_schema
from validation.payment import validate_payment

PERIOD = DateRange(date(2026, 1, 15), date(2026, 4, 10))
DAYS = [f"2026-{m:02d}-{d:02d}" for m in (1, 2, 3, 4) for d in (1, 9, 14, 15, 28)]


@pytest.fixture(scope="module", params=BACKENDS)
def store(request, tmp_path_factory):
    with ExitStack() as stack:
        if request.param == "postgres":
            db = PostgresDatabase(stack.enter_context(new_postgres_schema()))
        else:
            db = Database(str(tmp_path_factory.mktemp("sql") / "tally.db"))
        stack.callback(db.close)
        directory = Directory(db, FakeClock(), counting_bytes())
        account = directory.create_account("A", "free")
        sites = itertools.count()

        def new_site() -> int:
            public_id = directory.create_site(account["id"], [f"s{next(sites)}.example"])["id"]
            return directory.find_site(public_id).id

        payments = PaymentStore(db, FakeClock())
        stack.callback(payments.stop)
        yield db, payments, new_site


def stamp(day: str, hour: int) -> str:
    return f"{day}T{hour:02d}:00:00Z"


subscription = st.fixed_dictionaries(
    {"id": st.sampled_from(["s1", "s2", "s3"])},
    optional={
        "status": st.sampled_from(["active", "past_due", "canceled", "trialing"]),
        "amount": st.sampled_from([0, 10, 99.99, 100]),
        "interval": st.sampled_from(["day", "week", "month", "year"]),
        "started_at": st.builds(stamp, st.sampled_from(DAYS), st.sampled_from([0, 12])),
        "ended_at": st.builds(stamp, st.sampled_from(DAYS), st.sampled_from([0, 12])),
    },
)
payment = st.builds(
    lambda n, customer, currency, kind, status, day, hour, sub: {
        "payment_id": f"p{n}", "customer": {"id": customer}, "amount": 7.5,
        "currency": currency, "kind": kind, "status": status, "paid_at": stamp(day, hour),
        **({"subscription": sub} if sub else {})},
    st.integers(0, 7), st.sampled_from(["x", "y"]), st.sampled_from(["USD", "EUR"]),
    st.sampled_from(["charge", "charge", "refund"]), st.sampled_from(["succeeded", "failed"]),
    st.sampled_from(DAYS), st.sampled_from([0, 12, 23]), st.one_of(st.none(), subscription),
)


def history_of(db: Database, site_id: int) -> SubscriptionHistory:
    conn = db.conn()
    observations = [
        Observation(sub, customer, currency, at, status, None if amount is None else Decimal(amount),
                    interval, plan, started, ended, seq)
        for seq, (sub, customer, currency, at, status, amount, interval, plan, started, ended)
        in enumerate(conn.execute(
            "SELECT subscription_id, customer_id, currency, effective_at_ms, status, amount,"
            " interval, plan, started_at_ms, ended_at_ms FROM subscription_observations"
            " WHERE site_id = ? ORDER BY id", (site_id,)))
    ]
    payments = [
        SubscriptionPayment(sub, currency, Decimal(amount), paid_at, kind, status, seq)
        for seq, (sub, currency, amount, paid_at, kind, status) in enumerate(conn.execute(
            "SELECT subscription_id, currency, amount, paid_at_ms, kind, status FROM payments"
            " WHERE site_id = ? AND subscription_id IS NOT NULL ORDER BY id", (site_id,)))
    ]
    return SubscriptionHistory(observations, payments)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(payment, min_size=1, max_size=12))
def test_sql_reports_equal_the_in_memory_model(store, bodies):
    db, payments, new_site = store
    site_id = new_site()
    for body in bodies:
        payments.upsert(site_id, validate_payment(body))
    history = history_of(db, site_id)
    conn = db.conn()
    assert queries.movements(conn, site_id, PERIOD)["currencies"] == mrr_movements(history, PERIOD)
    for day in (date(2026, 1, 31), date(2026, 2, 14), date(2026, 4, 30)):
        assert queries.mrr(conn, site_id, day)["currencies"] == mrr_at(history, day, {})
