"""The pure mapping from Stripe events to Tally writes, rule by rule (README, Stripe)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tests.stripe_events import (
    FIXTURES,
    charge,
    dispute,
    invoice,
    invoice_line,
    price,
    refund,
    stripe_event,
    stripe_object,
    subscription,
    unix,
)
from validation.stripe import (
    CustomerWrite,
    InvoicePayment,
    PaymentWrite,
    SubscriptionWrite,
    UnusableEvent,
    major_units,
    map_event,
)

T = unix("2026-09-21T12:00:00Z")


def writes(event_type: str, obj: dict, created: int = T):
    mapped = map_event(stripe_event(event_type, obj, created=created))
    assert mapped.handled
    return mapped.writes


# Stripe's currency list, currency by currency: (currency, minor-unit amount, major units).
@pytest.mark.parametrize("currency, amount, expected", [
    ("usd", 4999, "49.99"), ("eur", 1, "0.01"), ("gbp", 100, "1"),
    ("jpy", 500, "500"), ("krw", 12000, "12000"), ("clp", 990, "990"), ("vnd", 50000, "50000"),
    ("bif", 7, "7"), ("djf", 7, "7"), ("gnf", 7, "7"), ("kmf", 7, "7"), ("mga", 7, "7"),
    ("pyg", 7, "7"), ("rwf", 7, "7"), ("vuv", 7, "7"), ("xaf", 7, "7"), ("xof", 7, "7"),
    ("xpf", 7, "7"),
    ("ugx", 500, "500"),  # on Stripe's zero-decimal list
    ("isk", 500, "5"),  # special case: two-decimal in the API, whole krónur (x100)
    ("huf", 500, "5"),  # special case: two-decimal for charges
    ("twd", 500, "5"),  # special case: two-decimal for charges
    ("bhd", 5120, "5.12"), ("jod", 5125, "5.125"), ("kwd", 5120, "5.12"),
    ("omr", 10, "0.01"), ("tnd", 1230, "1.23"),
])
def test_amounts_follow_stripes_minor_units(currency, amount, expected):
    assert major_units(amount, currency) == Decimal(expected)
    (write,) = writes("charge.succeeded", charge("ch_c", amount, customer="cus_1",
                                                 created="2026-09-21", currency=currency))
    assert (write.payment.amount, write.payment.currency) == (Decimal(expected), currency.upper())


@pytest.mark.parametrize("event_type, status, tally_status, rank", [
    ("charge.succeeded", "succeeded", "succeeded", 1),
    ("charge.failed", "failed", "failed", 1),
    ("charge.pending", "pending", "pending", 0),
])
def test_charges_become_one_payment_each(event_type, status, tally_status, rank):
    obj = charge("ch_1", 2000, customer="cus_9", created="2026-09-20T08:00:00Z", status=status,
                 metadata={"order": "42", "tally_visitor_id": "-42"},
                 billing_details={"email": "Ada@Example.com", "name": "Ada",
                                  "address": {"country": "de"}, "phone": None})
    (write,) = writes(event_type, obj)
    payment = write.payment
    assert isinstance(write, PaymentWrite) and write.keeps_subscription
    assert (payment.payment_id, payment.kind, payment.status) == ("ch_1", "charge", tally_status)
    assert payment.paid_at.text == "2026-09-20T08:00:00Z"
    assert payment.metadata == {"order": "42"}  # the link is the customer's, not the payment's
    customer = payment.customer
    assert (customer.id, customer.email, customer.name, customer.country, customer.visitor_id) == (
        "cus_9", "ada@example.com", "Ada", "DE", "-42")
    assert (write.version.object_id, write.version.rank, write.version.created) == ("ch_1", rank, T)


def test_fee_comes_from_an_expanded_balance_transaction_in_the_charge_currency():
    transaction = stripe_object("balance_transaction", fee=175, currency="usd")
    (with_fee,) = writes("charge.succeeded", charge("ch_1", 4999, customer="cus_1", created="2026-09-21",
                                                    balance_transaction=transaction))
    assert with_fee.payment.fee == Decimal("1.75")
    (unexpanded,) = writes("charge.succeeded", charge("ch_1", 4999, customer="cus_1", created="2026-09-21",
                                                      balance_transaction="txn_1"))
    assert unexpanded.payment.fee is None
    settled_in_eur = stripe_object("balance_transaction", fee=160, currency="eur")
    (converted,) = writes("charge.succeeded", charge("ch_1", 4999, customer="cus_1", created="2026-09-21",
                                                     balance_transaction=settled_in_eur))
    assert converted.payment.fee is None


def test_a_guest_charge_belongs_to_its_payment_intent_else_itself():
    (write,) = writes("charge.succeeded", charge("ch_g", 100, customer=None, created="2026-09-21",
                                                 payment_intent="pi_g"))
    assert write.payment.customer.id == "pi_g"
    (alone,) = writes("charge.succeeded", charge("ch_h", 100, customer=None, created="2026-09-21"))
    assert alone.payment.customer.id == "ch_h"


def test_stripes_example_charge_maps():
    (write,) = writes("charge.succeeded", FIXTURES["charge"])
    assert (write.payment.payment_id, write.payment.amount) == ("ch_1PgafuB7WZ01zgkWXYmPNZs8",
                                                                 Decimal("1"))
    # Stripe's example is authorized but not captured: no money yet.
    assert (write.payment.status, write.version.rank) == ("pending", 0)


def test_an_uncaptured_charge_is_pending_until_captured_and_failed_when_it_expires():
    authorized = charge("ch_a", 3000, customer="cus_1", created="2026-09-21", captured=False,
                        amount_captured=0)
    (write,) = writes("charge.succeeded", authorized)
    assert (write.payment.status, write.payment.amount, write.version.rank) == (
        "pending", Decimal(30), 0)
    captured = charge("ch_a", 3000, customer="cus_1", created="2026-09-21", amount_captured=2500)
    (write,) = writes("charge.captured", captured)
    assert (write.payment.status, write.payment.amount, write.version.rank) == (
        "succeeded", Decimal(25), 1)
    (write,) = writes("charge.expired", authorized)
    assert (write.payment.status, write.version.rank) == ("failed", 1)


@pytest.mark.parametrize("event_type", ["refund.created", "refund.updated", "charge.refund.updated"])
def test_refunds_become_refund_payments(event_type):
    (write,) = writes(event_type, refund("re_1", "ch_1", 1500, created="2026-10-02"))
    assert (write.payment.payment_id, write.payment.kind, write.payment.amount) == (
        "re_1", "refund", Decimal("15"))
    assert write.charge_id == "ch_1"  # the store gives it the charge's customer


def test_charge_refunded_carries_each_refund():
    refunds = {"object": "list", "has_more": False, "data": [
        refund("re_1", "ch_1", 500, created="2026-10-01"),
        refund("re_2", "ch_1", 700, created="2026-10-03", status="pending")]}
    obj = charge("ch_1", 4999, customer="cus_1", created="2026-09-21", refunds=refunds,
                 amount_refunded=1200, refunded=False)
    charge_write, first, second = writes("charge.refunded", obj)
    assert charge_write.payment.payment_id == "ch_1"
    assert [(w.payment.payment_id, w.payment.status, w.payment.customer.id) for w in (first, second)] == [
        ("re_1", "succeeded", "cus_1"), ("re_2", "pending", "cus_1")]


@pytest.mark.parametrize("status, tally_status, rank", [
    ("warning_needs_response", "pending", 0), ("warning_under_review", "pending", 0),
    ("needs_response", "succeeded", 0), ("under_review", "succeeded", 0),
    ("lost", "succeeded", 1), ("won", "failed", 1), ("warning_closed", "failed", 1),
])
def test_disputes_are_chargebacks_that_a_win_cancels(status, tally_status, rank):
    (write,) = writes("charge.dispute.closed", dispute("dp_1", "ch_1", 4999,
                                                       created="2026-10-05", status=status))
    payment = write.payment
    assert (payment.payment_id, payment.kind, payment.status) == ("dp_1", "chargeback", tally_status)
    assert payment.paid_at.text == "2026-10-05T12:00:00Z"
    assert (write.charge_id, write.version.rank) == ("ch_1", rank)


def _pro_invoice(**changes):
    lines = changes.pop("lines", [invoice_line("sub_1", 2000, start="2026-09-21", end="2026-10-21")])
    return invoice("in_1", "sub_1", "cus_1", charge_id="ch_1", lines=lines, paid="2026-09-21", **changes)


def test_a_paid_invoice_gives_its_charge_the_subscription_block():
    (write,) = writes("invoice.paid", _pro_invoice())
    assert isinstance(write, InvoicePayment) and write.charge_id == "ch_1"
    sub = write.payment.subscription
    assert (sub.id, sub.status, sub.interval, sub.amount, sub.plan) == (
        "sub_1", "active", "month", Decimal("20"), "prod_x")
    assert sub.current_period_end.text == "2026-10-21T12:00:00Z"
    assert (write.payment.payment_id, write.payment.amount) == ("ch_1", Decimal("20"))


def test_invoice_amount_counts_quantity_and_discounts_but_not_prorations():
    lines = [
        invoice_line("sub_1", 6000, start="2026-09-21", end="2026-10-21", quantity=3, discount=600),
        invoice_line("sub_1", 1500, start="2026-09-21", end="2026-10-21", proration=True),
    ]
    (write,) = writes("invoice.payment_succeeded", _pro_invoice(lines=lines))
    assert write.payment.subscription.amount == Decimal("54")


@pytest.mark.parametrize("start, end, interval, amount", [
    ("2026-09-21", "2027-09-21", "year", "240"),
    ("2026-09-21", "2026-09-28", "week", "240"),
    ("2026-09-21", "2026-12-21", "year", "960"),  # every 3 months: 4 x 240 a year
])
def test_invoice_interval_comes_from_the_line_period(start, end, interval, amount):
    lines = [invoice_line("sub_1", 24000, start=start, end=end)]
    (write,) = writes("invoice.paid", _pro_invoice(lines=lines))
    assert (write.payment.subscription.interval, write.payment.subscription.amount) == (
        interval, Decimal(amount))


def test_an_invoice_without_its_charge_records_a_subscription_state():
    obj = _pro_invoice()
    del obj["payments"]
    (write,) = writes("invoice.paid", obj)
    assert isinstance(write, SubscriptionWrite)
    assert (write.subscription.amount, write.effective_at.text) == (Decimal("20"),
                                                                    "2026-09-21T12:00:00Z")


def test_a_free_invoice_gives_nothing():
    lines = [invoice_line("sub_1", 0, start="2026-09-21", end="2026-10-21")]
    obj = _pro_invoice(lines=lines)
    obj["amount_paid"] = 0
    assert writes("invoice.paid", obj) == ()


def test_a_one_off_invoice_gives_nothing():
    obj = _pro_invoice()
    obj["parent"] = None
    assert writes("invoice.paid", obj) == ()


def test_the_pre_2025_invoice_shape_is_read_too():
    line = invoice_line("sub_1", 2000, start="2026-09-21", end="2026-10-21")
    line.update(type="subscription", proration=False, parent=None,
                price=price("price_pro", 2000, product="prod_old"))
    obj = _pro_invoice(lines=[line], charge="ch_old", subscription="sub_1", parent=None)
    del obj["payments"]
    (write,) = writes("invoice.paid", obj)
    assert write.charge_id == "ch_old"
    assert (write.payment.subscription.plan, write.payment.subscription.amount) == (
        "prod_old", Decimal("20"))


@pytest.mark.parametrize("stripe_status, status", [
    ("active", "active"), ("trialing", "trialing"), ("past_due", "past_due"),
    ("canceled", "canceled"), ("unpaid", "paused"), ("paused", "paused"),
    ("incomplete", "paused"), ("incomplete_expired", "ended"),
])
def test_subscription_events_record_a_state_without_a_payment(stripe_status, status):
    obj = subscription("sub_1", "cus_1", [(price("price_pro", 2000, product="prod_pro"), 2)],
                       status=stripe_status, start="2026-09-01",
                       metadata={"tally_user_id": "user-7"})
    (write,) = writes("customer.subscription.updated", obj, created=unix("2026-10-03"))
    assert isinstance(write, SubscriptionWrite)
    sub = write.subscription
    assert (sub.id, sub.status, sub.plan, sub.interval, sub.amount) == (
        "sub_1", status, "prod_pro", "month", Decimal("40"))
    assert (write.effective_at.text, sub.started_at.text) == ("2026-10-03T12:00:00Z",
                                                              "2026-09-01T12:00:00Z")
    assert (write.customer.id, write.customer.user_id, write.currency) == ("cus_1", "user-7", "USD")


def test_a_deleted_subscription_ends():
    obj = subscription("sub_1", "cus_1", [(price("p", 2000), 1)], status="canceled",
                       start="2026-09-01", canceled_at="2026-11-05", ended_at="2026-11-05")
    (write,) = writes("customer.subscription.deleted", obj, created=unix("2026-11-05"))
    assert (write.subscription.status, write.subscription.ended_at.text) == (
        "canceled", "2026-11-05T12:00:00Z")


def test_plan_is_the_product_name_when_expanded_else_its_id_else_the_nickname():
    cases = [({"id": "prod_1", "name": "Pro"}, "N", "Pro"), ("prod_1", "N", "prod_1"), (None, "N", "N")]
    for product, nickname, plan in cases:
        item_price = price("p", 1000, nickname=nickname, product=product)
        obj = subscription("sub_1", "cus_1", [(item_price, 1)], status="active", start="2026-09-01")
        (write,) = writes("customer.subscription.updated", obj)
        assert write.subscription.plan == plan


def test_mixed_intervals_and_discounts():
    mixed = subscription("sub_1", "cus_1", [(price("m", 1000), 1), (price("y", 12000, interval="year"), 1)],
                         status="active", start="2026-09-01")
    (write,) = writes("customer.subscription.updated", mixed)
    assert (write.subscription.interval, write.subscription.amount) == ("year", Decimal("240"))
    discounted = subscription("sub_1", "cus_1", [(price("m", 1000), 1)], status="active",
                              start="2026-09-01", discounts=["di_1"])
    (write,) = writes("customer.subscription.updated", discounted)
    # No amount: MRR takes the latest charge of the subscription, as Stripe discounted it.
    assert (write.subscription.interval, write.subscription.amount) == ("month", None)


def test_checkout_session_links_the_visitor_to_the_customer():
    session = stripe_object("checkout.session", customer="cus_1", mode="subscription",
                            metadata={"tally_visitor_id": "123", "tally_user_id": "u-1"})
    (write,) = writes("checkout.session.completed", session)
    assert isinstance(write, CustomerWrite)
    assert (write.customer.id, write.customer.visitor_id, write.customer.user_id,
            write.customer.email) == ("cus_1", "123", "u-1", "example@example.com")
    guest = stripe_object("checkout.session", metadata={"tally_visitor_id": "9"})
    (write,) = writes("checkout.session.completed", guest)
    assert write.customer.id == FIXTURES["checkout.session"]["payment_intent"]


def test_payment_intent_and_customer_metadata_link_too():
    intent = stripe_object("payment_intent", customer="cus_1", metadata={"tally_visitor_id": "5"})
    (write,) = writes("payment_intent.succeeded", intent)
    assert (write.customer.id, write.customer.visitor_id) == ("cus_1", "5")
    assert writes("payment_intent.succeeded", stripe_object("payment_intent")) == ()
    customer = stripe_object("customer", email="b@example.com", metadata={"tally_user_id": "u-2"})
    (write,) = writes("customer.updated", customer)
    assert (write.customer.email, write.customer.user_id) == ("b@example.com", "u-2")


def test_unknown_types_are_not_handled():
    mapped = map_event(stripe_event("plan.created", FIXTURES["event"]["data"]["object"], created=T))
    assert (mapped.handled, mapped.writes) == (False, ())


@pytest.mark.parametrize("event, message", [
    ([], "invalid Stripe event: the body must be an object"),
    ({"type": "charge.succeeded", "created": T, "data": {"object": {}}},
     "invalid Stripe event: id must be a string of 1-255 characters"),
    ({"id": "evt_1", "created": T, "data": {"object": {}}},
     "invalid Stripe event: type must be a string of 1-255 characters"),
    ({"id": "evt_1", "type": "x", "created": "now", "data": {"object": {}}},
     "invalid Stripe event: created must be a unix time in seconds"),
    ({"id": "evt_1", "type": "x", "created": T, "data": {}},
     "invalid Stripe event: data.object must be an object"),
    ({"id": "evt_1", "type": "charge.succeeded", "created": T,
      "data": {"object": {"object": "charge", "id": "ch_1", "amount": 5, "currency": "zzz",
                          "created": T, "status": "succeeded"}}},
     "Stripe charge ch_1 cannot be stored: invalid payment input: currency: "
     "must be a 3-letter ISO 4217 code"),
    ({"id": "evt_1", "type": "charge.succeeded", "created": T,
      "data": {"object": {"object": "charge", "id": "ch_1", "amount": 5}}},
     "Stripe charge ch_1 is not shaped as documented (KeyError)"),
])
def test_unusable_events_say_why(event, message):
    with pytest.raises(UnusableEvent) as caught:
        map_event(event)
    assert str(caught.value) == message


def test_collection_paused_counts_as_paused():
    obj = subscription("sub_1", "cus_1", [(price("p", 1000), 1)], status="active",
                       start="2026-09-01", pause_collection={"behavior": "void", "resumes_at": None})
    (write,) = writes("customer.subscription.paused", obj)
    assert write.subscription.status == "paused"


def test_an_invoice_carries_the_subscriptions_links_and_customer_details():
    obj = _pro_invoice(customer_email="Eve@Example.com", customer_name="Eve",
                       customer_address={"country": "fr"})
    obj["parent"]["subscription_details"]["metadata"] = {"tally_visitor_id": "77"}
    (write,) = writes("invoice.paid", obj)
    customer = write.payment.customer
    assert (customer.id, customer.email, customer.name, customer.country, customer.visitor_id) == (
        "cus_1", "eve@example.com", "Eve", "FR", "77")


def test_invalid_optional_customer_fields_are_left_out_not_refused():
    obj = charge("ch_1", 100, customer="cus_1", created="2026-09-21",
                 metadata={"tally_visitor_id": "x" * 129},
                 billing_details={"email": "not-an-email", "name": "N" * 201,
                                  "address": {"country": "XX"}})
    (write,) = writes("charge.succeeded", obj)
    customer = write.payment.customer
    assert (customer.email, customer.name, customer.country, customer.visitor_id) == (
        None, None, None, None)
