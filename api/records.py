"""GET /api/v1/payments/{payment_id} and GET /api/v1/customers/{customer_id} (scope `read`).

Both only ever read the key's own site; another site's id is 404 like an unknown one.
Each answer is read in one snapshot (Database.snapshot), so its parts agree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from decimal import Decimal

import falcon

from api.auth import Authenticator, key_scope
from api.errors import not_found
from attribution.first_touch import customer_attribution
from reports.money.amounts import exact_decimals, round_money
from storage.db import Database
from storage.payments import (
    find_customer,
    find_payment,
    find_payment_subscription,
    succeeded_amounts,
)


class PaymentRecord:
    def __init__(self, auth: Authenticator, db: Database):
        self.auth = auth
        self.db = db

    @falcon.before(key_scope("read"))
    def on_get(self, req, resp, payment_id: str):
        key = req.context.key
        with self.db.snapshot() as conn:
            payment = find_payment(conn, key.site_id, payment_id)
            if payment is None:
                raise not_found(f"no payment {payment_id} on this site")
            customer_id = payment.pop("customer_id")
            data = {
                **payment,
                "customer": find_customer(conn, key.site_id, customer_id),
                "subscription": find_payment_subscription(conn, key.site_id, payment_id),
                "attribution": customer_attribution(conn, key.site_id, customer_id),
            }
        resp.media = {"ok": True, "data": data}


class CustomerRecord:
    def __init__(self, auth: Authenticator, db: Database):
        self.auth = auth
        self.db = db

    @falcon.before(key_scope("read"))
    def on_get(self, req, resp, customer_id: str):
        key = req.context.key
        with self.db.snapshot() as conn:
            customer = find_customer(conn, key.site_id, customer_id)
            if customer is None:
                raise not_found(f"no customer {customer_id} on this site")
            data = {
                **customer,
                "attribution": customer_attribution(conn, key.site_id, customer_id),
                "totals": customer_totals(succeeded_amounts(conn, key.site_id, customer_id)),
            }
        resp.media = {"ok": True, "data": data}


def customer_totals(payments: Iterable[tuple[str, str, Decimal]]) -> dict:
    """Per currency, over (currency, kind, amount) of succeeded payments: paid (charges),
    refunded (refunds and chargebacks), net = paid - refunded, and the number of payments;
    exact sums rounded once to the currency's minor unit."""
    paid: dict[str, Decimal] = defaultdict(Decimal)
    refunded: dict[str, Decimal] = defaultdict(Decimal)
    counts: dict[str, int] = defaultdict(int)
    with exact_decimals():  # never the default context, which rounds at 28 digits
        for currency, kind, amount in payments:
            if kind == "charge":
                paid[currency] += amount
            else:
                refunded[currency] += amount
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
