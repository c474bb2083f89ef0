"""GET /api/v1/payments/{payment_id} and GET /api/v1/customers/{customer_id} (scope `read`).

Both only ever read the key's own site; another site's id is 404 like an unknown one.
Each answer is read in one transaction, so its parts come from one snapshot.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from contextlib import contextmanager
from decimal import Decimal

import orjson

from api.auth import Authenticator
from api.errors import not_found
from attribution.first_touch import customer_attribution
from reports.money import dumps, round_money
from storage.db import Database

_CUSTOMER = (
    "SELECT customer_id, email, user_id, visitor_id, name, country, metadata FROM customers"
    " WHERE site_id = ? AND customer_id = ?"
)
_PAYMENT = (
    "SELECT payment_id, customer_id, amount, currency, fee, kind, status, paid_at, metadata"
    " FROM payments WHERE site_id = ? AND payment_id = ?"
)
_SUBSCRIPTION = (
    "SELECT subscription_id, plan, interval, status, amount, started_at, current_period_end,"
    " canceled_at, ended_at FROM subscription_observations WHERE site_id = ? AND payment_id = ?"
)
_TOTALS = (
    "SELECT currency, kind, amount FROM payments"
    " WHERE site_id = ? AND customer_id = ? AND status = 'succeeded'"
)


class PaymentRecord:
    def __init__(self, auth: Authenticator, db: Database):
        self.auth = auth
        self.db = db

    def on_get(self, req, resp, payment_id: str):
        key = self.auth.authenticate(req.get_header("Authorization"), scope="read")
        with _snapshot(self.db.conn()) as conn:
            row = conn.execute(_PAYMENT, (key.site_id, payment_id)).fetchone()
            if row is None:
                raise not_found(f"no payment {payment_id} on this site")
            customer_id = row[1]
            data = {
                "payment_id": row[0],
                "amount": Decimal(row[2]),
                "currency": row[3],
                "fee": None if row[4] is None else Decimal(row[4]),
                "kind": row[5],
                "status": row[6],
                "paid_at": row[7],
                "metadata": _json(row[8]),
                "customer": _customer(conn, key.site_id, customer_id),
                "subscription": _subscription(conn, key.site_id, payment_id),
                "attribution": customer_attribution(conn, key.site_id, customer_id),
            }
        _write(resp, data)


class CustomerRecord:
    def __init__(self, auth: Authenticator, db: Database):
        self.auth = auth
        self.db = db

    def on_get(self, req, resp, customer_id: str):
        key = self.auth.authenticate(req.get_header("Authorization"), scope="read")
        with _snapshot(self.db.conn()) as conn:
            customer = _customer(conn, key.site_id, customer_id)
            if customer is None:
                raise not_found(f"no customer {customer_id} on this site")
            data = {
                **customer,
                "attribution": customer_attribution(conn, key.site_id, customer_id),
                "totals": _totals(conn, key.site_id, customer_id),
            }
        _write(resp, data)


@contextmanager
def _snapshot(conn: sqlite3.Connection):
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        conn.execute("COMMIT")


def _customer(conn: sqlite3.Connection, site_id: int, customer_id: str) -> dict | None:
    row = conn.execute(_CUSTOMER, (site_id, customer_id)).fetchone()
    if row is None:
        return None
    return {
        "id": row[0], "email": row[1], "user_id": row[2], "visitor_id": row[3],
        "name": row[4], "country": row[5], "metadata": _json(row[6]),
    }


def _subscription(conn: sqlite3.Connection, site_id: int, payment_id: str) -> dict | None:
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


def _totals(conn: sqlite3.Connection, site_id: int, customer_id: str) -> dict:
    """Per currency, over succeeded payments: paid (charges), refunded (refunds and
    chargebacks), net = paid - refunded, and the number of payments; exact sums rounded
    once to the currency's minor unit."""
    paid: dict[str, Decimal] = defaultdict(Decimal)
    refunded: dict[str, Decimal] = defaultdict(Decimal)
    counts: dict[str, int] = defaultdict(int)
    for currency, kind, amount in conn.execute(_TOTALS, (site_id, customer_id)):
        if kind == "charge":
            paid[currency] += Decimal(amount)
        else:
            refunded[currency] += Decimal(amount)
        counts[currency] += 1
    return {
        currency: {
            "paid": round_money(paid[currency], currency),
            "refunded": round_money(refunded[currency], currency),
            "net": round_money(paid[currency] - refunded[currency], currency),
            "payments": counts[currency],
        }
        for currency in sorted(counts)
    }


def _json(text: str | None):
    return None if text is None else orjson.loads(text)


def _write(resp, data: dict) -> None:
    resp.status = 200
    resp.content_type = "application/json"
    resp.data = dumps({"ok": True, "data": data})
