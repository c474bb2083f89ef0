"""Stripe webhook state: each site's signing secret, the events applied, the newest
version of each Stripe object, and the writes of one event in one transaction.

`StripeStore.apply` writes an event's payments, subscription states and customers
through storage.payments (the same statements as POST /api/v1/payments) together with
the event's id, in one BEGIN IMMEDIATE ... COMMIT: an event is applied once, entirely.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sqlite3
from collections.abc import Callable
from decimal import Decimal

import orjson

from storage.db import Database
from storage.payments import (
    SUBSCRIPTION_STATE,
    PaymentStore,
    refresh_subscription,
    subscription_state,
    write_customer,
)
from storage.statements import statement
from validation.payment import Customer, Instant, Payment, Subscription
from validation.stripe import (
    CustomerWrite,
    InvoicePayment,
    Mapped,
    PaymentWrite,
    SubscriptionWrite,
    Version,
)

_STATE_COLUMNS = ", ".join(SUBSCRIPTION_STATE)
_STATE_MARKS = ", ".join("?" for _ in SUBSCRIPTION_STATE)
_INSERT_EVENT_OBSERVATION = statement(
    f"INSERT INTO subscription_observations (site_id, {_STATE_COLUMNS}, event_id, received_at)"  # noqa: S608 - fixed columns
    f" VALUES (?, {_STATE_MARKS}, ?, ?)"
)
_STORED_PAYMENT = statement(
    "SELECT payment_id, customer_id, amount, currency, fee, kind, status, paid_at, paid_at_ms,"
    " metadata FROM payments WHERE site_id = ? AND payment_id = ?"
)
_STORED_SUBSCRIPTION = statement(
    "SELECT subscription_id, status, started_at, started_at_ms, plan, interval, amount,"
    " current_period_end, current_period_end_ms, canceled_at, canceled_at_ms, ended_at,"
    " ended_at_ms FROM subscription_observations WHERE site_id = ? AND payment_id = ?"
)


_SET_SECRET = statement(
    "INSERT INTO stripe_webhook_secrets (site_id, secret, fingerprint, created_at)"
    " VALUES (?, ?, ?, ?) ON CONFLICT (site_id) DO UPDATE SET secret = excluded.secret,"
    " fingerprint = excluded.fingerprint, created_at = excluded.created_at")
_REMOVE_SECRET = statement("DELETE FROM stripe_webhook_secrets WHERE site_id = ?")
_SECRET = statement("SELECT secret FROM stripe_webhook_secrets WHERE site_id = ?")
_EVENT_SEEN = statement(
    "SELECT 1 FROM stripe_events WHERE site_id = ? AND event_id = ?")
_INSERT_EVENT = statement(
    "INSERT INTO stripe_events (site_id, event_id, type, created, received_at)"
    " VALUES (?, ?, ?, ?, ?)")
_PAYMENT_CUSTOMER = statement(
    "SELECT customer_id FROM payments WHERE site_id = ? AND payment_id = ?")
_OBJECT_RANK = statement(
    "SELECT rank, created FROM stripe_objects WHERE site_id = ? AND object_id = ?")
_UPSERT_OBJECT_RANK = statement(
    "INSERT INTO stripe_objects (site_id, object_id, rank, created) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (site_id, object_id) DO UPDATE SET rank = excluded.rank,"
    " created = excluded.created")


def fingerprint(secret: str) -> str:
    """What people see of a secret: enough to tell two apart, nothing to rebuild one."""
    return "sha256:" + hashlib.sha256(secret.encode("utf-8")).hexdigest()[:12]


class StripeStore:
    def __init__(self, db: Database, clock: Callable[[], float]):
        self.db = db
        self.clock = clock

    # Secrets -----------------------------------------------------------------------
    def set_secret(self, site_id: int, secret: str) -> str:
        mark = fingerprint(secret)
        with self.db.transaction() as conn:
            conn.execute(
                _SET_SECRET,
                (site_id, secret, mark, int(self.clock() * 1000)),
            )
        return mark

    def remove_secret(self, site_id: int) -> bool:
        with self.db.transaction() as conn:
            removed = conn.execute(_REMOVE_SECRET,
                                   (site_id,)).rowcount
        return removed > 0

    def secret(self, site_id: int) -> str | None:
        row = self.db.conn().execute(
            _SECRET, (site_id,)).fetchone()
        return row[0] if row else None

    # Events --------------------------------------------------------------------------
    def apply(self, site_id: int, mapped: Mapped) -> bool:
        """Apply the event's writes; False (and nothing written) when it was applied before."""
        now_ms = int(self.clock() * 1000)
        with self.db.transaction() as conn:
            seen = conn.execute(_EVENT_SEEN,
                                (site_id, mapped.event_id)).fetchone()
            if seen:
                return False
            for write in mapped.writes:
                _apply_write(conn, site_id, mapped.event_id, write, now_ms)
            conn.execute(
                _INSERT_EVENT,
                (site_id, mapped.event_id, mapped.type, mapped.created, now_ms),
            )
        return True


def _apply_write(conn: sqlite3.Connection, site_id: int, event_id: str, write,
                 now_ms: int) -> None:
    if isinstance(write, PaymentWrite):
        if not _newest(conn, site_id, write.version):
            return
        payment = write.payment
        if write.charge_id:
            owner = conn.execute(
                _PAYMENT_CUSTOMER,
                (site_id, write.charge_id)).fetchone()
            if owner and owner[0] != payment.customer.id:
                payment = dataclasses.replace(payment, customer=Customer(id=owner[0]))
        if write.keeps_subscription and payment.subscription is None:
            payment = dataclasses.replace(
                payment, subscription=_stored_subscription(conn, site_id, payment.payment_id))
        PaymentStore.write(conn, site_id, payment, now_ms)
    elif isinstance(write, InvoicePayment):
        if not _newest(conn, site_id, write.version):
            return
        stored = _stored_payment(conn, site_id, write.charge_id)
        payment = write.payment if stored is None else dataclasses.replace(
            stored, subscription=write.payment.subscription)
        PaymentStore.write(conn, site_id, payment, now_ms)
    elif isinstance(write, SubscriptionWrite):
        customer, effective_ms = write.customer, write.effective_at.unix_ms
        write_customer(conn, site_id, customer, effective_ms, now_ms)
        state = subscription_state(write.subscription, customer.id, None, effective_ms,
                                   write.currency)
        conn.execute(_INSERT_EVENT_OBSERVATION, (site_id, *state, event_id, now_ms))
        refresh_subscription(conn, site_id, write.subscription.id, now_ms)
    elif isinstance(write, CustomerWrite):
        write_customer(conn, site_id, write.customer, write.as_of.unix_ms, now_ms)
    else:  # pragma: no cover - the mapping makes only the four kinds above
        raise TypeError(f"unknown write {type(write).__name__}")


def _newest(conn: sqlite3.Connection, site_id: int, version: Version) -> bool:
    """Whether this version of the object is at least as new as any applied; if so it is
    recorded as the newest."""
    row = conn.execute(_OBJECT_RANK,
                       (site_id, version.object_id)).fetchone()
    if row is not None and tuple(row) > (version.rank, version.created):
        return False
    conn.execute(
        _UPSERT_OBJECT_RANK,
        (site_id, version.object_id, version.rank, version.created),
    )
    return True


def _stored_payment(conn: sqlite3.Connection, site_id: int, payment_id: str) -> Payment | None:
    row = conn.execute(_STORED_PAYMENT, (site_id, payment_id)).fetchone()
    if row is None:
        return None
    (payment_id, customer_id, amount, currency, fee, kind, status, paid_at, paid_at_ms,
     metadata) = row
    return Payment(
        payment_id=payment_id, customer=Customer(id=customer_id), amount=Decimal(amount),
        currency=currency, kind=kind, paid_at=Instant(paid_at, paid_at_ms), status=status,
        fee=None if fee is None else Decimal(fee),
        metadata=None if metadata is None else orjson.loads(metadata),
        subscription=_stored_subscription(conn, site_id, payment_id),
    )


def _stored_subscription(conn: sqlite3.Connection, site_id: int,
                         payment_id: str) -> Subscription | None:
    row = conn.execute(_STORED_SUBSCRIPTION, (site_id, payment_id)).fetchone()
    if row is None:
        return None
    (sub_id, status, started, started_ms, plan, interval, amount, period_end, period_end_ms,
     canceled, canceled_ms, ended, ended_ms) = row
    return Subscription(
        id=sub_id, status=status, started_at=Instant(started, started_ms), plan=plan,
        interval=interval, amount=None if amount is None else Decimal(amount),
        current_period_end=_instant(period_end, period_end_ms),
        canceled_at=_instant(canceled, canceled_ms), ended_at=_instant(ended, ended_ms),
    )


def _instant(text: str | None, unix_ms: int | None) -> Instant | None:
    return None if text is None else Instant(text, unix_ms)
