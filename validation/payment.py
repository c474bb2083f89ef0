"""The body of POST /api/v1/payments, checked against the spec and cleaned.

`validate_payment(body)` takes what orjson parsed and returns a `Payment`, or raises
`PaymentShapeError` (not an object, unknown field: "invalid JSON: ...") or
`InvalidPayment` (every invalid field, sorted, with the spec's messages).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from validation.common import (
    RFC3339_EXAMPLE,
    country_code,
    currency_code,
    json_decimal,
    parse_rfc3339,
)

KINDS = ("charge", "refund", "chargeback")
PAYMENT_STATUSES = ("succeeded", "pending", "failed")
INTERVALS = ("day", "week", "month", "year")
SUBSCRIPTION_STATUSES = ("active", "trialing", "past_due", "paused", "canceled", "ended")

PAYMENT_FIELDS = frozenset(
    {"payment_id", "customer", "amount", "currency", "fee", "kind", "paid_at", "status",
     "metadata", "subscription"}
)
CUSTOMER_FIELDS = frozenset({"id", "email", "user_id", "name", "country", "visitor_id", "metadata"})
SUBSCRIPTION_FIELDS = frozenset(
    {"id", "plan", "interval", "status", "amount", "started_at", "current_period_end",
     "canceled_at", "ended_at"}
)

_IDENTIFIER = re.compile(r"[A-Za-z0-9_\-:.]{1,128}")
_ID_RULE = "required, 1-128 chars of [A-Za-z0-9_-:.]"
_STRING_VALUES = "must be an object whose values are strings"
_TEXT_200 = "must be a string of at most 200 characters"
_TEXT_128_BYTES = "must be a string of 1-128 bytes"
NAME_MAX_CHARS = 200
LINK_ID_MAX_BYTES = 128  # the same bound as an event's uid, so user_id can match it
EMAIL_MAX_CHARS = 320

# Amounts, fees and subscription amounts: below 10^15 with at most 12 decimal places, so
# every value has at most 23 digits and a sum of any realistic number of them stays exact
# within the reports' 60 digits (reports/money/amounts.py). Beyond every real amount in every
# ISO 4217 currency (minor units go down to 4 places; a quadrillion is far above any
# single payment), and it keeps 1e-60 or 1e61 out of the sums.
MONEY_LIMIT = Decimal(10) ** 15
MONEY_MAX_PLACES = 12
MONEY_TOO_LARGE = "must be less than 1000000000000000 (10^15)"
MONEY_TOO_PRECISE = f"must have at most {MONEY_MAX_PLACES} decimal places"

# The spec's table word for word; the rows it leaves out follow its style.
MESSAGES = {
    "payment_id": _ID_RULE,
    "customer": "required, must be an object",
    "customer.id": _ID_RULE,
    "customer.email": "must be an email address",
    "customer.country": "must be ISO 3166-1 alpha-2",
    "customer.user_id": _TEXT_128_BYTES,
    "customer.visitor_id": _TEXT_128_BYTES,
    "customer.name": _TEXT_200,
    "customer.metadata": _STRING_VALUES,
    "amount": "must be greater than 0",
    "fee": "must not be negative",
    "currency": "must be a 3-letter ISO 4217 code",
    "kind": "must be one of " + ", ".join(KINDS),
    "paid_at": f"must be RFC 3339 (a timestamp such as {RFC3339_EXAMPLE})",
    "status": "must be one of " + ", ".join(PAYMENT_STATUSES),
    "metadata": _STRING_VALUES,
    "subscription": "must be an object",
    "subscription.id": "required when subscription is set",
    "subscription.plan": _TEXT_200,
    "subscription.interval": "must be one of " + ", ".join(INTERVALS),
    "subscription.status": "must be one of " + ", ".join(SUBSCRIPTION_STATUSES),
    "subscription.amount": "must not be negative",
    "subscription.started_at": "must be RFC 3339",
    "subscription.current_period_end": "must be RFC 3339",
    "subscription.canceled_at": "must be RFC 3339",
    "subscription.ended_at": "must be RFC 3339",
}


class PaymentInputError(ValueError):
    """The body cannot be stored; str() is the whole message for the caller."""


class PaymentShapeError(PaymentInputError):
    """Not a JSON object, or a field the spec does not define (message "invalid JSON: ...")."""


class InvalidPayment(PaymentInputError):
    """One or more fields break the spec's rules."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(sorted(errors.items()))
        details = "; ".join(f"{field}: {message}" for field, message in self.errors.items())
        super().__init__(f"invalid payment input: {details}")


class _Invalid(ValueError):
    """A field fails its check; `message` replaces the field's usual one when given."""

    def __init__(self, reason: str, message: str | None = None):
        super().__init__(reason)
        self.message = message


@dataclass(frozen=True)
class Instant:
    text: str  # as the caller wrote it
    unix_ms: int


@dataclass(frozen=True)
class Customer:
    id: str
    email: str | None = None
    user_id: str | None = None
    name: str | None = None
    country: str | None = None
    visitor_id: str | None = None
    metadata: dict[str, str] | None = None


@dataclass(frozen=True)
class Subscription:
    id: str
    status: str
    started_at: Instant
    plan: str | None = None
    interval: str | None = None
    amount: Decimal | None = None
    current_period_end: Instant | None = None
    canceled_at: Instant | None = None
    ended_at: Instant | None = None


@dataclass(frozen=True)
class Payment:
    payment_id: str
    customer: Customer
    amount: Decimal
    currency: str
    kind: str
    paid_at: Instant
    status: str
    fee: Decimal | None = None
    metadata: dict[str, str] | None = None
    subscription: Subscription | None = None


def validate_payment(body: Any) -> Payment:
    if not isinstance(body, dict):
        raise PaymentShapeError(f"invalid JSON: the body must be an object, not {_json_type(body)}")
    _reject_unknown_fields(body)
    errors: dict[str, str] = {}
    checker = _Checker(errors)

    payment_id = checker.required("payment_id", body.get("payment_id"), _identifier)
    amount = checker.required("amount", body.get("amount"), _positive)
    currency = checker.required("currency", body.get("currency"), currency_code)
    kind = checker.required("kind", body.get("kind"), _one_of(KINDS))
    paid_at = checker.required("paid_at", body.get("paid_at"), _instant)
    fee = checker.optional("fee", body.get("fee"), _not_negative)
    status = checker.optional("status", body.get("status"), _one_of(PAYMENT_STATUSES))
    metadata = checker.optional("metadata", body.get("metadata"), _string_values)
    customer = _customer(checker, body.get("customer"))
    subscription = _subscription(checker, body.get("subscription"), paid_at)

    if errors:
        raise InvalidPayment(errors)
    return Payment(
        payment_id=payment_id,
        customer=customer,
        amount=amount,
        currency=currency,
        kind=kind,
        paid_at=paid_at,
        status=status or "succeeded",
        fee=fee,
        metadata=metadata,
        subscription=subscription,
    )


def validate_customer(value: Any) -> Customer:
    """A customer object by the payment body's rules (for links sent without a payment)."""
    errors: dict[str, str] = {}
    customer = _customer(_Checker(errors), value)
    if errors:
        raise InvalidPayment(errors)
    return customer


def validate_subscription_state(customer: Any, currency: Any, effective_at: Any,
                                subscription: Any) -> tuple[Customer, str, Instant, Subscription]:
    """A subscription's state known without a payment, by the payment body's rules: its
    customer, currency, the instant it took effect, and the subscription block."""
    errors: dict[str, str] = {}
    checker = _Checker(errors)
    cleaned_customer = _customer(checker, customer)
    cleaned_currency = checker.required("currency", currency, currency_code)
    instant = checker.required("paid_at", effective_at, _instant)
    block = _subscription(checker, subscription, instant)
    if block is None and "subscription" not in errors:
        errors["subscription"] = MESSAGES["subscription"]
    if errors:
        raise InvalidPayment(errors)
    return cleaned_customer, cleaned_currency, instant, block


def _customer(checker: _Checker, value: Any) -> Customer | None:
    if not isinstance(value, dict):
        checker.errors["customer"] = MESSAGES["customer"]
        return None
    return Customer(
        id=checker.required("customer.id", value.get("id"), _identifier),
        email=checker.optional("customer.email", value.get("email"), _email),
        user_id=checker.optional("customer.user_id", value.get("user_id"), _link_id),
        name=checker.optional("customer.name", value.get("name"), _short_text),
        country=checker.optional("customer.country", value.get("country"), country_code),
        visitor_id=checker.optional("customer.visitor_id", value.get("visitor_id"), _link_id),
        metadata=checker.optional("customer.metadata", value.get("metadata"), _string_values),
    )


def _subscription(checker: _Checker, value: Any, paid_at: Instant | None) -> Subscription | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        checker.errors["subscription"] = MESSAGES["subscription"]
        return None
    started_at = checker.optional("subscription.started_at", value.get("started_at"), _instant)
    return Subscription(
        id=checker.required("subscription.id", value.get("id"), _identifier),
        status=checker.optional("subscription.status", value.get("status"),
                                _one_of(SUBSCRIPTION_STATUSES)) or "active",
        started_at=started_at or paid_at,
        plan=checker.optional("subscription.plan", value.get("plan"), _short_text),
        interval=checker.optional("subscription.interval", value.get("interval"),
                                  _one_of(INTERVALS)),
        amount=checker.optional("subscription.amount", value.get("amount"), _not_negative),
        current_period_end=checker.optional(
            "subscription.current_period_end", value.get("current_period_end"), _instant),
        canceled_at=checker.optional("subscription.canceled_at", value.get("canceled_at"), _instant),
        ended_at=checker.optional("subscription.ended_at", value.get("ended_at"), _instant),
    )


class _Checker:
    """Runs one check per field and records the field's message when it fails."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors

    def required(self, field: str, value: Any, check: Callable[[Any], Any]) -> Any:
        try:
            if value is None:
                raise _Invalid("missing")
            return check(value)
        except ValueError as exc:
            self.errors[field] = getattr(exc, "message", None) or MESSAGES[field]
            return None

    def optional(self, field: str, value: Any, check: Callable[[Any], Any]) -> Any:
        # JSON null means "not given", as many client libraries send it for empty fields.
        if value is None:
            return None
        return self.required(field, value, check)


def _reject_unknown_fields(body: dict) -> None:
    unknown = [key for key in body if key not in PAYMENT_FIELDS]
    for section, allowed in (("customer", CUSTOMER_FIELDS), ("subscription", SUBSCRIPTION_FIELDS)):
        nested = body.get(section)
        if isinstance(nested, dict):
            unknown += [f"{section}.{key}" for key in nested if key not in allowed]
    if unknown:
        names = ", ".join(json.dumps(name, ensure_ascii=False) for name in sorted(unknown))
        plural = "s" if len(unknown) > 1 else ""
        raise PaymentShapeError(f"invalid JSON: unknown field{plural} {names}")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array"


def _identifier(value: Any) -> str:
    if isinstance(value, str) and _IDENTIFIER.fullmatch(value):
        return value
    raise _Invalid("not an identifier")


def _positive(value: Any) -> Decimal:
    amount = json_decimal(value)
    if amount <= 0:
        raise _Invalid("not positive")
    return _bounded(amount)


def _not_negative(value: Any) -> Decimal:
    amount = json_decimal(value)
    if amount < 0:
        raise _Invalid("negative")
    return _bounded(amount.copy_abs())  # -0 becomes 0, without rounding to a context


def _bounded(amount: Decimal) -> Decimal:
    """Within what the reports sum exactly (reports/money/amounts.py keeps 60 digits)."""
    if amount >= MONEY_LIMIT:
        raise _Invalid("too large", MONEY_TOO_LARGE)
    if amount.as_tuple().exponent < -MONEY_MAX_PLACES:
        raise _Invalid("too precise", MONEY_TOO_PRECISE)
    return amount


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if isinstance(value, str) and value in choices:
            return value
        raise _Invalid("not a choice")

    return check


def _instant(value: Any) -> Instant:
    return Instant(value, parse_rfc3339(value))


def _email(value: Any) -> str:
    if isinstance(value, str) and "@" in value and len(value) <= EMAIL_MAX_CHARS:
        return value.lower()
    raise _Invalid("not an email address")


def _link_id(value: Any) -> str:
    if isinstance(value, str) and 1 <= len(value.encode("utf-8")) <= LINK_ID_MAX_BYTES:
        return value
    raise _Invalid("not 1-128 bytes")


def _short_text(value: Any) -> str:
    if isinstance(value, str) and len(value) <= NAME_MAX_CHARS:
        return value
    raise _Invalid("too long")


def _string_values(value: Any) -> dict[str, str]:
    if isinstance(value, dict) and all(isinstance(item, str) for item in value.values()):
        return value
    raise _Invalid("not an object of strings")
