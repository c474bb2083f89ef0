"""Stripe webhook events for tests: Stripe's published example objects (tests/data/stripe,
see ORIGIN.txt there) with only the fields a test is about changed, signed as Stripe
signs them: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" under the secret>`."""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import orjson

FIXTURES = json.loads((Path(__file__).parent / "data" / "stripe" / "fixtures3.json").read_text())
SECRET = "whsec_" + "T3st" * 8


def unix(text: str) -> int:
    """'2026-09-21T12:00:00Z' (or a date) as unix seconds."""
    if "T" not in text:
        text += "T12:00:00Z"
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp())


def stripe_object(resource: str, **changes) -> dict:
    """Stripe's example of the resource with top-level fields replaced."""
    obj = copy.deepcopy(FIXTURES[resource])
    obj.update(changes)
    return obj


def stripe_event(event_type: str, obj: dict, *, created: int, event_id: str | None = None) -> dict:
    event = copy.deepcopy(FIXTURES["event"])
    event.update(id=event_id or f"evt_{event_type}_{obj.get('id')}_{created}", type=event_type,
                 created=created, data={"object": obj})
    return event


def sign(body: bytes, secret: str = SECRET, timestamp: int | None = None) -> str:
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def charge(charge_id: str, amount: int, *, customer: str | None, created: str,
           currency: str = "usd", status: str = "succeeded", **changes) -> dict:
    fields = dict(id=charge_id, amount=amount, amount_captured=amount,
                  captured=status == "succeeded", currency=currency, status=status,
                  customer=customer, created=unix(created), payment_intent=None,
                  balance_transaction=None)
    return stripe_object("charge", **{**fields, **changes})


def refund(refund_id: str, charge_id: str, amount: int, *, created: str, currency: str = "usd",
           status: str = "succeeded") -> dict:
    return stripe_object("refund", id=refund_id, charge=charge_id, amount=amount,
                         currency=currency, status=status, created=unix(created))


def dispute(dispute_id: str, charge_id: str, amount: int, *, created: str,
            status: str = "needs_response", currency: str = "usd") -> dict:
    return stripe_object("dispute", id=dispute_id, charge=charge_id, amount=amount,
                         currency=currency, status=status, created=unix(created))


def price(price_id: str, unit_amount: int, *, nickname: str | None = None,
          product: str | dict | None = "prod_x", interval: str = "month",
          currency: str = "usd") -> dict:
    item_price = copy.deepcopy(FIXTURES["subscription"]["items"]["data"][0]["price"])
    item_price.update(id=price_id, unit_amount=unit_amount, unit_amount_decimal=str(unit_amount),
                      nickname=nickname, currency=currency, product=product)
    item_price["recurring"]["interval"] = interval
    return item_price


def subscription(sub_id: str, customer: str, items: list[tuple[dict, int]], *, status: str,
                 start: str, currency: str = "usd", canceled_at: str | None = None,
                 ended_at: str | None = None, metadata: dict | None = None, **changes) -> dict:
    template = FIXTURES["subscription"]["items"]["data"][0]
    data = []
    for n, (item_price, quantity) in enumerate(items):
        item = copy.deepcopy(template)
        item.update(id=f"si_{sub_id}_{n}", price=item_price, quantity=quantity, subscription=sub_id)
        item.pop("plan", None)
        item.update(current_period_start=unix(start), current_period_end=unix(start) + 30 * 86400)
        data.append(item)
    fields = dict(
        id=sub_id, customer=customer, status=status, currency=currency,
        start_date=unix(start), created=unix(start), discounts=[], cancel_at=None,
        cancel_at_period_end=False, pause_collection=None, trial_end=None, trial_start=None,
        canceled_at=canceled_at and unix(canceled_at), ended_at=ended_at and unix(ended_at),
        metadata=metadata or {})
    obj = stripe_object("subscription", **{**fields, **changes})
    obj["items"] = {**obj["items"], "data": data}
    return obj


def invoice(invoice_id: str, sub_id: str, customer: str, *, charge_id: str | None,
            lines: list[dict], paid: str, currency: str = "usd", **changes) -> dict:
    """A paid subscription invoice in the API shape since 2025-03-31 (parent details, the
    charge in `payments`)."""
    total = sum(line["amount"] - sum(d["amount"] for d in line["discount_amounts"])
                for line in lines)
    fields = dict(
        id=invoice_id, customer=customer, currency=currency, status="paid",
        amount_due=total, amount_paid=total, amount_remaining=0, total=total, subtotal=total,
        billing_reason="subscription_cycle", created=unix(paid),
        status_transitions={"finalized_at": unix(paid), "marked_uncollectible_at": None,
                            "paid_at": unix(paid), "voided_at": None},
        parent={"type": "subscription_details", "quote_details": None,
                "subscription_details": {"metadata": {}, "subscription": sub_id}},
    )
    obj = stripe_object("invoice", **{**fields, **changes})
    obj["lines"] = {**obj["lines"], "data": lines}
    if charge_id:
        obj["payments"] = {"object": "list", "has_more": False, "data": [
            {"object": "invoice_payment", "status": "paid", "amount_paid": total,
             "payment": {"type": "charge", "charge": charge_id}}]}
    return obj


def invoice_line(sub_id: str, amount: int, *, start: str, end: str, price_id: str = "price_x",
                 product: str = "prod_x", proration: bool = False,
                 discount: int = 0, quantity: int = 1) -> dict:
    line = copy.deepcopy(FIXTURES["invoice"]["lines"]["data"][0])
    line.update(
        id=f"il_{sub_id}_{start}_{amount}", amount=amount, quantity=quantity,
        discount_amounts=[{"amount": discount, "discount": "di_1"}] if discount else [],
        period={"start": unix(start), "end": unix(end)},
        parent={"type": "subscription_item_details", "invoice_item_details": None,
                "subscription_item_details": {"invoice_item": None, "proration": proration,
                                              "proration_details": {"credited_items": None},
                                              "subscription": sub_id,
                                              "subscription_item": f"si_{sub_id}_0"}},
        pricing={"type": "price_details", "unit_amount_decimal": str(amount // quantity),
                 "price_details": {"price": price_id, "product": product}},
    )
    return line


def body(event: dict) -> bytes:
    return orjson.dumps(event)
