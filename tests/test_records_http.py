"""GET /api/v1/payments/{payment_id} and GET /api/v1/customers/{customer_id} over WSGI."""

from __future__ import annotations

import orjson
import pytest

from tests.conftest import bearer

UNATTRIBUTED = {
    "channel": "Unattributed", "source": None, "referrer": None, "landing_page": None,
    "utm": {"source": None, "medium": None, "campaign": None, "term": None, "content": None},
    "first_seen": None,
}


def payment(payment_id="pay_1", customer_id="cus_1", **fields) -> dict:
    body = {"payment_id": payment_id, "amount": 49.9, "currency": "EUR", "kind": "charge",
            "paid_at": "2026-09-20T10:00:00+02:00", "customer": {"id": customer_id}}
    body.update(fields)
    return body


@pytest.fixture
def post(client, site):
    def post(body, key=None):
        client.post_json("/api/v1/payments", body, headers=bearer(key or site["key"]))
    return post


@pytest.fixture
def get(client, site):
    def get(path, key=None, status=200):
        resp = client.get(path, headers=bearer(key or site["key"]), status=status)
        return orjson.loads(resp.body)
    return get


def test_a_payment_with_its_customer_subscription_and_attribution(post, get):
    post(payment(
        fee=1.75, status="succeeded", metadata={"order": "A-17"},
        customer={"id": "cus_1", "email": "Ada@Example.COM", "user_id": "u-1", "name": "Ada",
                  "country": "GB", "visitor_id": "123", "metadata": {"tier": "gold"}},
        subscription={"id": "sub_1", "plan": "pro", "interval": "month", "amount": 49.9,
                      "current_period_end": "2026-10-20T08:00:00Z"},
    ))
    body = get("/api/v1/payments/pay_1")
    assert body == {"ok": True, "data": {
        "payment_id": "pay_1", "amount": 49.9, "currency": "EUR", "fee": 1.75, "kind": "charge",
        "status": "succeeded", "paid_at": "2026-09-20T10:00:00+02:00",
        "metadata": {"order": "A-17"},
        "customer": {"id": "cus_1", "email": "ada@example.com", "user_id": "u-1",
                     "visitor_id": "123", "name": "Ada", "country": "GB",
                     "metadata": {"tier": "gold"}},
        "subscription": {"id": "sub_1", "plan": "pro", "interval": "month", "status": "active",
                         "amount": 49.9, "started_at": "2026-09-20T10:00:00+02:00",
                         "current_period_end": "2026-10-20T08:00:00Z", "canceled_at": None,
                         "ended_at": None},
        "attribution": UNATTRIBUTED,
    }}


def test_a_payment_without_subscription_and_optional_fields(post, get):
    post(payment(payment_id="ord:2026.1", amount=10))
    data = get("/api/v1/payments/ord:2026.1")["data"]
    assert data["amount"] == 10 and data["fee"] is None and data["metadata"] is None
    assert data["subscription"] is None
    assert data["customer"] == {"id": "cus_1", "email": None, "user_id": None,
                                "visitor_id": None, "name": None, "country": None,
                                "metadata": None}


def test_amounts_come_back_exactly(client, post, site):
    post(payment(amount=0.1, fee=0.2))
    raw = client.get("/api/v1/payments/pay_1", headers=bearer(site["key"])).body
    assert b'"amount":0.1,' in raw and b'"fee":0.2,' in raw


def test_customer_totals_per_currency(post, get):
    rows = [
        ("p1", 100, "EUR", "charge", "succeeded"),
        ("p2", 20.5, "EUR", "refund", "succeeded"),
        ("p3", 9.99, "EUR", "chargeback", "succeeded"),
        ("p4", 1000, "EUR", "charge", "failed"),
        ("p5", 500, "EUR", "charge", "pending"),
        ("p6", 1200, "JPY", "charge", "succeeded"),
        ("p7", 0.005, "USD", "charge", "succeeded"),
    ]
    for payment_id, amount, currency, kind, status in rows:
        post(payment(payment_id=payment_id, amount=amount, currency=currency, kind=kind,
                     status=status, customer={"id": "cus_1", "email": "X@Y.io"}))
    data = get("/api/v1/customers/cus_1")["data"]
    assert data["email"] == "x@y.io"
    assert data["attribution"] == UNATTRIBUTED
    assert data["totals"] == {
        "EUR": {"paid": 100, "refunded": 30.49, "net": 69.51, "payments": 3},
        "JPY": {"paid": 1200, "refunded": 0, "net": 1200, "payments": 1},
        "USD": {"paid": 0.01, "refunded": 0, "net": 0.01, "payments": 1},
    }


def test_a_customer_without_payments_that_count(post, get):
    post(payment(status="failed", customer={"id": "cus_2"}))
    data = get("/api/v1/customers/cus_2")["data"]
    assert data["id"] == "cus_2" and data["totals"] == {}


@pytest.mark.parametrize("path", ["/api/v1/payments/nope", "/api/v1/customers/nope"])
def test_unknown_ids_are_404(get, path):
    body = get(path, status=404)
    assert body["ok"] is False and body["error"]["code"] == "not_found"


def test_reads_are_confined_to_the_keys_site(post, get, directory, site):
    other = directory.create_site(site["account"]["id"], ["other.example"])
    other_key = directory.create_key(other["id"], ["payments", "read"])["key"]
    post(payment(customer={"id": "cus_1", "name": "Ours"}))
    post(payment(payment_id="pay_other", amount=5, customer={"id": "cus_other", "name": "Theirs"}),
         key=other_key)
    assert get("/api/v1/payments/pay_other", status=404)["error"]["code"] == "not_found"
    assert get("/api/v1/customers/cus_other", status=404)["error"]["code"] == "not_found"
    assert get("/api/v1/payments/pay_other", key=other_key)["data"]["amount"] == 5
    # The same customer id on two sites is two customers.
    post(payment(payment_id="pay_3", customer={"id": "cus_1", "name": "Theirs too"}),
         key=other_key)
    assert get("/api/v1/customers/cus_1")["data"]["name"] == "Ours"
    assert get("/api/v1/customers/cus_1", key=other_key)["data"]["name"] == "Theirs too"


def test_reads_need_the_read_scope(client, directory, site, post):
    post(payment())
    writer = directory.create_key(site["site"]["id"], ["payments", "events"])["key"]
    for path in ("/api/v1/payments/pay_1", "/api/v1/customers/cus_1"):
        resp = client.get(path, headers=bearer(writer), status=403)
        assert resp.json["error"]["code"] == "forbidden"
        resp = client.get(path, status=401)
        assert resp.json["error"]["code"] == "unauthorized"
