"""Stripe webhook events mapped to Tally's payments, subscription states and customer links.

Pure: `map_event(event)` takes the parsed event and returns a `Mapped` whose writes are
already checked by Tally's payment rules (validation/payment.py), or raises
`UnusableEvent`. README's "Stripe" section states every rule; each is tested in
tests/test_stripe_mapping.py.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from validation.common import COUNTRY_CODES
from validation.payment import (
    EMAIL_MAX_CHARS,
    LINK_ID_MAX_BYTES,
    NAME_MAX_CHARS,
    Customer,
    Instant,
    InvalidPayment,
    Payment,
    Subscription,
    validate_customer,
    validate_payment,
    validate_subscription_state,
)

# https://docs.stripe.com/currencies: amounts are in the currency's minor unit. These are
# the zero-decimal currencies (the amount is whole units) and the three-decimal ones.
# Stripe's special cases ISK, HUF and TWD stay two-decimal in the API (ISK 500 is 5 kr,
# HUF 500 is 5 Ft); UGX is on the zero-decimal list (UGX 500 is 500 USh).
ZERO_DECIMAL_CURRENCIES = frozenset(
    "BIF CLP DJF GNF JPY KMF KRW MGA PYG RWF UGX VND VUV XAF XOF XPF".split())
THREE_DECIMAL_CURRENCIES = frozenset("BHD JOD KWD OMR TND".split())

VISITOR_KEY = "tally_visitor_id"
USER_KEY = "tally_user_id"

YEARLY_FACTORS = {"day": 365, "week": 52, "month": 12, "year": 1}
_DAYS_PER_MONTH = 365.2425 / 12


class UnusableEvent(ValueError):
    """The event is not a Stripe event, or its object cannot be stored; str() says why."""


@dataclass(frozen=True)
class Version:
    """Which delivery of a Stripe object is newer: higher status rank, then later event."""

    object_id: str
    rank: int
    created: int  # the event's time, unix seconds


@dataclass(frozen=True)
class PaymentWrite:
    payment: Payment
    version: Version
    charge_id: str | None = None  # refunds and disputes take the customer of this charge
    keeps_subscription: bool = False  # a charge keeps the subscription its invoice gave it


@dataclass(frozen=True)
class InvoicePayment:
    """An invoice's subscription block for the charge that paid it. When that charge is not
    stored yet, `payment` (built from the invoice) stands for it until it arrives."""

    charge_id: str
    payment: Payment
    version: Version


@dataclass(frozen=True)
class SubscriptionWrite:
    """A subscription's state without a payment, effective at `effective_at`."""

    customer: Customer
    currency: str
    effective_at: Instant
    subscription: Subscription


@dataclass(frozen=True)
class CustomerWrite:
    customer: Customer
    as_of: Instant


Write = PaymentWrite | InvoicePayment | SubscriptionWrite | CustomerWrite


@dataclass(frozen=True)
class Mapped:
    event_id: str
    type: str
    created: int
    handled: bool  # False: a type Tally does not use, answered 200 and ignored
    writes: tuple[Write, ...] = ()


def major_units(amount: int, currency: str) -> Decimal:
    """A Stripe amount (minor units of the currency, upper or lower case) in major units."""
    code = currency.upper()
    exponent = 0 if code in ZERO_DECIMAL_CURRENCIES else 3 if code in THREE_DECIMAL_CURRENCIES else 2
    return Decimal(amount).scaleb(-exponent)


def map_event(event: Any) -> Mapped:
    if not isinstance(event, dict):
        raise UnusableEvent("invalid Stripe event: the body must be an object")
    event_id, event_type, created = event.get("id"), event.get("type"), event.get("created")
    obj = (event.get("data") or {}).get("object") if isinstance(event.get("data"), dict) else None
    if not (isinstance(event_id, str) and 1 <= len(event_id) <= 255):
        raise UnusableEvent("invalid Stripe event: id must be a string of 1-255 characters")
    if not (isinstance(event_type, str) and 1 <= len(event_type) <= 255):
        raise UnusableEvent("invalid Stripe event: type must be a string of 1-255 characters")
    if not _is_time(created):
        raise UnusableEvent("invalid Stripe event: created must be a unix time in seconds")
    if not isinstance(obj, dict):
        raise UnusableEvent("invalid Stripe event: data.object must be an object")
    handler = HANDLERS.get(event_type)
    if handler is None:
        return Mapped(event_id, event_type, created, handled=False)
    try:
        writes = tuple(handler(obj, created))
    except InvalidPayment as exc:
        raise UnusableEvent(f"Stripe {_text(obj.get('object')) or 'object'} "
                            f"{_text(obj.get('id')) or '?'} cannot be stored: {exc}") from None
    except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as exc:
        raise UnusableEvent(f"Stripe {_text(obj.get('object')) or 'object'} "
                            f"{_text(obj.get('id')) or '?'} is not shaped as documented "
                            f"({type(exc).__name__})") from None
    return Mapped(event_id, event_type, created, handled=True, writes=writes)


# Charges ----------------------------------------------------------------------------

_CHARGE_STATUSES = {"succeeded": ("succeeded", 1), "failed": ("failed", 1),
                    "pending": ("pending", 0)}


def _charge(charge: dict, created: int) -> list[Write]:
    status, rank = _CHARGE_STATUSES.get(charge.get("status"), ("pending", 0))
    if status == "succeeded" and charge.get("captured") is False:
        status, rank = "pending", 0  # authorized, not captured: no money yet
    amount = charge.get("amount")
    if charge.get("captured") and _positive_int(charge.get("amount_captured")):
        amount = charge["amount_captured"]
    writes: list[Write] = []
    customer = _charge_customer(charge)
    if _positive_int(amount):
        currency = charge["currency"]
        body = {
            "payment_id": charge["id"],
            "customer": customer,
            "amount": major_units(amount, currency),
            "currency": currency.upper(),
            "kind": "charge",
            "status": status,
            "paid_at": _rfc3339(charge["created"]),
            "fee": _fee(charge.get("balance_transaction"), currency),
            "metadata": _metadata(charge.get("metadata")),
        }
        writes.append(PaymentWrite(validate_payment(_without_none(body)),
                                   Version(charge["id"], rank, created), keeps_subscription=True))
    refunds = charge.get("refunds")
    for refund in (refunds.get("data") or []) if isinstance(refunds, dict) else []:
        writes += _refund(refund, created, customer=customer, charge_id=charge["id"])
    return writes


def _expired_charge(charge: dict, created: int) -> list[Write]:
    """An authorization never captured: the charge failed to take money."""
    return [_with_status(write, "failed", 1) if isinstance(write, PaymentWrite)
            and write.payment.payment_id == charge["id"] else write
            for write in _charge(charge, created)]


def _with_status(write: PaymentWrite, status: str, rank: int) -> PaymentWrite:
    return dataclasses.replace(write, payment=dataclasses.replace(write.payment, status=status),
                               version=dataclasses.replace(write.version, rank=rank))


def _charge_customer(charge: dict) -> dict:
    expanded = charge.get("customer") if isinstance(charge.get("customer"), dict) else {}
    intent = charge.get("payment_intent") if isinstance(charge.get("payment_intent"), dict) else {}
    billing = charge.get("billing_details") or {}
    return _customer(
        _id(charge.get("customer")) or _id(charge.get("payment_intent")) or charge["id"],
        email=billing.get("email") or charge.get("receipt_email") or expanded.get("email"),
        name=billing.get("name") or expanded.get("name"),
        country=(billing.get("address") or {}).get("country")
        or (expanded.get("address") or {}).get("country"),
        metadata=(charge.get("metadata"), intent.get("metadata"), expanded.get("metadata")),
    )


def _fee(transaction: Any, currency: str) -> Decimal | None:
    """The fee of an expanded balance transaction in the charge's own currency, else none."""
    if not isinstance(transaction, dict) or not isinstance(transaction.get("fee"), int):
        return None
    if str(transaction.get("currency", "")).lower() != currency.lower():
        return None
    return major_units(transaction["fee"], currency)


# Refunds and disputes -----------------------------------------------------------------

_REFUND_STATUSES = {"succeeded": ("succeeded", 1), "failed": ("failed", 1),
                    "canceled": ("failed", 1), "pending": ("pending", 0),
                    "requires_action": ("pending", 0)}


def _refund(refund: dict, created: int, customer: dict | None = None,
            charge_id: str | None = None) -> list[Write]:
    if not _positive_int(refund.get("amount")):
        return []
    status, rank = _REFUND_STATUSES.get(refund.get("status"), ("pending", 0))
    charge_id = _id(refund.get("charge")) or charge_id
    customer = customer or _customer(
        _id(refund.get("customer")) or _id(refund.get("payment_intent")) or charge_id
        or refund["id"])
    return [_taken_back(refund, "refund", status, customer, charge_id, rank, created)]


def _taken_back(obj: dict, kind: str, status: str, customer: dict, charge_id: str | None,
                rank: int, created: int) -> PaymentWrite:
    """A refund or a dispute as the payment that takes money back from its charge."""
    currency = obj["currency"]
    body = {
        "payment_id": obj["id"],
        "customer": customer,
        "amount": major_units(obj["amount"], currency),
        "currency": currency.upper(),
        "kind": kind,
        "status": status,
        "paid_at": _rfc3339(obj["created"]),
        "metadata": _metadata(obj.get("metadata")),
    }
    return PaymentWrite(validate_payment(_without_none(body)), Version(obj["id"], rank, created),
                        charge_id=charge_id)


# A dispute takes the money back while it is open (inquiries, `warning_*`, take nothing
# yet) and for good when lost; one won, or an inquiry closed, gives it back: the
# chargeback becomes `failed`, which no report counts.
_DISPUTE_STATUSES = {
    "warning_needs_response": ("pending", 0), "warning_under_review": ("pending", 0),
    "needs_response": ("succeeded", 0), "under_review": ("succeeded", 0),
    "lost": ("succeeded", 1), "won": ("failed", 1), "warning_closed": ("failed", 1),
    "prevented": ("failed", 1),
}


def _dispute(dispute: dict, created: int) -> list[Write]:
    if not _positive_int(dispute.get("amount")):
        return []
    status, rank = _DISPUTE_STATUSES.get(dispute.get("status"), ("succeeded", 0))
    charge = dispute.get("charge")
    charge_id = _id(charge)
    customer = (_charge_customer(charge) if isinstance(charge, dict) else
                _customer(_id(dispute.get("payment_intent")) or charge_id or dispute["id"]))
    return [_taken_back(dispute, "chargeback", status, customer, charge_id, rank, created)]


# Invoices -----------------------------------------------------------------------------

def _invoice(invoice: dict, created: int) -> list[Write]:
    subscription_id = _id(invoice.get("subscription")) or _id(
        _dig(invoice, "parent", "subscription_details", "subscription"))
    lines = [line for line in _list(invoice.get("lines")) if _is_recurring_line(line)]
    if not subscription_id or not lines:
        return []  # a one-off or proration-only invoice: its charge is a plain payment
    currency = invoice["currency"]
    intervals = [_line_interval(line) for line in lines]
    amounts = [Decimal(line["amount"]) - sum(
        (Decimal(d["amount"]) for d in line.get("discount_amounts") or []), Decimal(0))
        for line in lines]
    interval, amount = _per_interval(zip(intervals, amounts, strict=True))
    if amount == 0 and not _positive_int(invoice.get("amount_paid")):
        return []  # a trial's or fully discounted invoice: the subscription events say more
    paid_at = _dig(invoice, "status_transitions", "paid_at") or created
    block = {
        "id": subscription_id,
        "status": "active",
        "plan": _short(_line_plan(lines[0])),
        "interval": interval,
        "amount": None if amount is None else major_units(amount, currency),
        "current_period_end": _rfc3339(max(line["period"]["end"] for line in lines)),
    }
    details = _dig(invoice, "parent", "subscription_details") or invoice.get(
        "subscription_details") or {}
    expanded = invoice.get("customer") if isinstance(invoice.get("customer"), dict) else {}
    customer = _customer(
        _id(invoice.get("customer")),
        email=invoice.get("customer_email"), name=invoice.get("customer_name"),
        country=(invoice.get("customer_address") or {}).get("country"),
        metadata=(details.get("metadata"), invoice.get("metadata"), expanded.get("metadata")))
    charge_id = _invoice_charge(invoice)
    if charge_id and _positive_int(invoice.get("amount_paid")):
        body = {
            "payment_id": charge_id,
            "customer": customer,
            "amount": major_units(invoice["amount_paid"], currency),
            "currency": currency.upper(),
            "kind": "charge",
            "status": "succeeded",
            "paid_at": _rfc3339(paid_at),
            "subscription": _without_none(block),
        }
        return [InvoicePayment(charge_id, validate_payment(_without_none(body)),
                               Version(invoice["id"], 1, created))]
    return [_subscription_write(customer, currency, paid_at, block)]


def _invoice_charge(invoice: dict) -> str | None:
    """The charge that paid the invoice: `charge` before API version 2025-03-31, else a
    paid entry of `payments` when the event carries them."""
    if invoice.get("charge"):
        return _id(invoice["charge"])
    for entry in _list(invoice.get("payments")):
        payment = entry.get("payment") or {}
        if entry.get("status") in (None, "paid") and payment.get("charge"):
            return _id(payment["charge"])
    return None


def _is_recurring_line(line: dict) -> bool:
    """A subscription's own line for a full period: not a proration, not a one-off item."""
    parent = line.get("parent") or {}
    if parent.get("type"):  # API 2025-03-31 and later
        details = parent.get("subscription_item_details") or {}
        return parent["type"] == "subscription_item_details" and not details.get("proration")
    return line.get("type") == "subscription" and not line.get("proration")


def _line_price(line: dict) -> dict:
    price = line.get("price") or _dig(line, "pricing", "price_details", "price") or line.get("plan")
    return price if isinstance(price, dict) else {}


def _line_interval(line: dict) -> tuple[str, int]:
    price = _line_price(line)
    recurring = price.get("recurring") or ({"interval": price["interval"],
                                            "interval_count": price.get("interval_count")}
                                           if price.get("interval") else None)
    if recurring:
        return recurring["interval"], int(recurring.get("interval_count") or 1)
    return _period_interval(line["period"]["start"], line["period"]["end"])


def _period_interval(start: int, end: int) -> tuple[str, int]:
    """The billing interval a line's period spans (new invoice lines do not name it)."""
    days = (end - start) / 86_400
    months = round(days / _DAYS_PER_MONTH)
    if months >= 1 and abs(days - months * _DAYS_PER_MONTH) <= 3:
        return ("year", months // 12) if months % 12 == 0 else ("month", months)
    whole_days = max(1, round(days))
    return ("week", whole_days // 7) if whole_days % 7 == 0 else ("day", whole_days)


def _line_plan(line: dict) -> str | None:
    """The product (its name when expanded, else its id): the one name invoices of every API
    version and subscription items all carry; else the price's nickname."""
    price = _line_price(line)
    product = price.get("product") or _dig(line, "pricing", "price_details", "product")
    return _product_name(product) or price.get("nickname") or line.get("description")


# Subscriptions --------------------------------------------------------------------------

_SUBSCRIPTION_STATUSES = {
    "active": "active", "trialing": "trialing", "past_due": "past_due", "paused": "paused",
    "canceled": "canceled", "unpaid": "paused", "incomplete": "paused",
    "incomplete_expired": "ended",
}


def _subscription(subscription: dict, created: int) -> list[Write]:
    items = _list(subscription.get("items"))
    status = _SUBSCRIPTION_STATUSES.get(subscription.get("status"), "paused")
    if status == "active" and subscription.get("pause_collection"):
        status = "paused"
    priced = []
    for item in items:
        price = item.get("price") or item.get("plan") or {}
        unit = price.get("unit_amount_decimal") or price.get("unit_amount") or price.get("amount")
        recurring = price.get("recurring") or {"interval": price.get("interval"),
                                               "interval_count": price.get("interval_count")}
        if unit is None or not recurring.get("interval"):
            priced = None  # tiered or metered: no fixed amount
            break
        priced.append(((recurring["interval"], int(recurring.get("interval_count") or 1)),
                       Decimal(str(unit)) * int(item.get("quantity") or 1)))
    discounted = bool(subscription.get("discounts") or subscription.get("discount"))
    interval, amount = (None, None)
    if priced and not discounted:
        interval, amount = _per_interval(priced)
    elif items:
        first = items[0].get("price") or items[0].get("plan") or {}
        interval = (first.get("recurring") or {}).get("interval") or first.get("interval")
    currency = subscription["currency"]
    period_ends = [subscription.get("current_period_end")] + [
        item.get("current_period_end") for item in items]
    period_end = max((t for t in period_ends if _is_time(t)), default=None)
    block = {
        "id": subscription["id"],
        "status": status,
        "plan": _short(_line_plan({"price": items[0].get("price") or items[0].get("plan")})
                       if items else None),
        "interval": interval,
        "amount": None if amount is None else major_units(amount, currency),
        "started_at": _rfc3339(subscription.get("start_date") or subscription["created"]),
        "current_period_end": _rfc3339(period_end),
        "canceled_at": _rfc3339(subscription.get("canceled_at")),
        "ended_at": _rfc3339(subscription.get("ended_at")),
    }
    expanded = subscription.get("customer") if isinstance(subscription.get("customer"), dict) else {}
    customer = _customer(_id(subscription.get("customer")), email=expanded.get("email"),
                         name=expanded.get("name"),
                         metadata=(subscription.get("metadata"), expanded.get("metadata")))
    return [_subscription_write(customer, currency, created, block)]


def _subscription_write(customer: dict, currency: str, effective_at: int,
                        block: dict) -> SubscriptionWrite:
    cleaned = validate_subscription_state(customer, currency.upper(), _rfc3339(effective_at),
                                          _without_none(block))
    return SubscriptionWrite(*cleaned)


def _per_interval(priced: Iterable[tuple[tuple[str, int], Decimal]]
                  ) -> tuple[str | None, Decimal | None]:
    """One interval and the amount per interval of recurring prices: their own interval
    when they all bill every single day, week, month or year alike; otherwise a year."""
    priced = list(priced)
    if not priced:
        return None, None
    kinds = {interval for interval, _ in priced}
    if len(kinds) == 1 and next(iter(kinds))[1] == 1:
        return next(iter(kinds))[0], sum((amount for _, amount in priced), Decimal(0))
    yearly = sum((amount * YEARLY_FACTORS[unit] / count for (unit, count), amount in priced),
                 Decimal(0))
    return "year", yearly


# Customers and their visitor links ------------------------------------------------------

def _checkout_session(session: dict, created: int) -> list[Write]:
    customer_id = _id(session.get("customer")) or _id(session.get("payment_intent"))
    if not customer_id:
        return []
    details = session.get("customer_details") or {}
    customer = _customer(customer_id, email=details.get("email") or session.get("customer_email"),
                         name=details.get("name"),
                         country=(details.get("address") or {}).get("country"),
                         metadata=(session.get("metadata"),))
    return [CustomerWrite(validate_customer(customer), Instant(*_instant(session["created"])))]


def _payment_intent(intent: dict, created: int) -> list[Write]:
    customer = _customer(_id(intent.get("customer")) or intent["id"],
                         metadata=(intent.get("metadata"),))
    if "visitor_id" not in customer and "user_id" not in customer:
        return []
    return [CustomerWrite(validate_customer(customer), Instant(*_instant(intent["created"])))]


def _stripe_customer(customer: dict, created: int) -> list[Write]:
    body = _customer(customer["id"], email=customer.get("email"), name=customer.get("name"),
                     country=(customer.get("address") or {}).get("country"),
                     metadata=(customer.get("metadata"),))
    return [CustomerWrite(validate_customer(body), Instant(*_instant(created)))]


def _customer(customer_id: str | None, *, email: Any = None, name: Any = None,
              country: Any = None, metadata: tuple = ()) -> dict:
    """A customer body: optional fields Tally would refuse are left out, not refused."""
    body: dict[str, Any] = {"id": customer_id}
    if isinstance(email, str) and "@" in email and len(email) <= EMAIL_MAX_CHARS:
        body["email"] = email
    if isinstance(name, str) and name and len(name) <= NAME_MAX_CHARS:
        body["name"] = name
    if isinstance(country, str) and country.upper() in COUNTRY_CODES:
        body["country"] = country.upper()
    for field, key in (("visitor_id", VISITOR_KEY), ("user_id", USER_KEY)):
        for values in metadata:
            value = values.get(key) if isinstance(values, dict) else None
            if isinstance(value, str) and 1 <= len(value.encode()) <= LINK_ID_MAX_BYTES:
                body[field] = value
                break
    return body


# Helpers ---------------------------------------------------------------------------------

def _id(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("id")
    return value if isinstance(value, str) and value else None


def _text(value: Any) -> str | None:
    return value[:80] if isinstance(value, str) else None


def _short(value: Any) -> str | None:
    return value[:NAME_MAX_CHARS] if isinstance(value, str) and value else None


def _product_name(product: Any) -> str | None:
    if isinstance(product, dict):
        return product.get("name") or product.get("id")
    return product if isinstance(product, str) else None


def _dig(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _list(value: Any) -> list[dict]:
    data = value.get("data") if isinstance(value, dict) else None
    return [item for item in data if isinstance(item, dict)] if isinstance(data, list) else []


def _metadata(value: Any) -> dict[str, str] | None:
    """An object's metadata for the payment, without the visitor and user links: those are
    the customer's (where erasing a customer clears them), not the payment's."""
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        return None
    kept = {key: text for key, text in value.items() if key not in (VISITOR_KEY, USER_KEY)}
    return kept or None


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_time(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 253_402_300_800


def _instant(unix_seconds: int) -> tuple[str, int]:
    if not _is_time(unix_seconds):
        raise ValueError("not a unix time")
    moment = datetime.datetime.fromtimestamp(unix_seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ"), unix_seconds * 1000


def _rfc3339(unix_seconds: Any) -> str | None:
    return None if unix_seconds is None else _instant(unix_seconds)[0]


def _without_none(body: dict) -> dict:
    return {key: value for key, value in body.items() if value is not None}


HANDLERS: dict[str, Callable[[dict, int], list[Write]]] = {
    "charge.succeeded": _charge,
    "charge.failed": _charge,
    "charge.pending": _charge,
    "charge.captured": _charge,
    "charge.updated": _charge,
    "charge.refunded": _charge,
    "charge.expired": _expired_charge,
    "refund.created": _refund,
    "refund.updated": _refund,
    "refund.failed": _refund,
    "charge.refund.updated": _refund,
    "charge.dispute.created": _dispute,
    "charge.dispute.updated": _dispute,
    "charge.dispute.closed": _dispute,
    "charge.dispute.funds_withdrawn": _dispute,
    "charge.dispute.funds_reinstated": _dispute,
    "invoice.paid": _invoice,
    "invoice.payment_succeeded": _invoice,
    "customer.subscription.created": _subscription,
    "customer.subscription.updated": _subscription,
    "customer.subscription.deleted": _subscription,
    "customer.subscription.paused": _subscription,
    "customer.subscription.resumed": _subscription,
    "checkout.session.completed": _checkout_session,
    "checkout.session.async_payment_succeeded": _checkout_session,
    "payment_intent.succeeded": _payment_intent,
    "payment_intent.created": _payment_intent,
    "customer.created": _stripe_customer,
    "customer.updated": _stripe_customer,
}

