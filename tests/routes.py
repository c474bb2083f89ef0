"""A sample request for every documented operation, to walk all routes in security and fault tests."""

from __future__ import annotations

import re

import orjson

from app import create_app
from config import Config
from tests.test_openapi import DOCUMENT, HTTP_METHODS, served_operations, template

HOST = "example.com"
BROWSER_UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"


def payment(payment_id: str = "pay_1", customer_id: str = "cus_1", amount: float = 19.99,
            **extra) -> dict:
    return {
        "payment_id": payment_id,
        "customer": {"id": customer_id, "email": "Ada@Example.com", "user_id": "user-1"},
        "amount": amount,
        "currency": "EUR",
        "kind": "charge",
        "paid_at": "2026-09-21T12:00:00Z",
        "subscription": {"id": "sub_1", "plan": "pro", "interval": "month", "amount": amount},
        **extra,
    }


def event(site_id: str, path: str = "/pricing", **extra) -> dict:
    return {"s": site_id, "e": "pageview", "u": f"https://{HOST}{path}", "ip": "203.0.113.7",
            "ua": BROWSER_UA, **extra}


def operations() -> list[tuple[str, str]]:
    return [
        (method.upper(), path)
        for path, item in DOCUMENT["paths"].items()
        for method in item
        if method in HTTP_METHODS
    ]


def served_now() -> list[tuple[str, str]]:
    """The documented operations this build of the app serves (building it opens no file)."""
    served = served_operations(create_app(Config(db_path=":memory:")).wsgi)
    return [op for op in operations() if (op[0], template(op[1])) in served]


def sample_request(method: str, path: str, site_id: str) -> tuple[str, str, bytes | None]:
    """(method, concrete path, body) of a valid request for the operation."""
    concrete = re.sub(r"\{payment_id\}", "pay_1", path)
    concrete = re.sub(r"\{customer_id\}", "cus_1", concrete)
    if path == "/api/v1/stats/breakdown":
        concrete += "?by=channel"
    body = None
    if (method, path) == ("POST", "/api/v1/payments"):
        body = orjson.dumps(payment())
    elif (method, path) == ("POST", "/api/v1/events"):
        body = orjson.dumps(event(site_id))
    elif (method, path) == ("POST", "/api/v1/collect"):
        body = orjson.dumps({k: v for k, v in event(site_id).items() if k not in ("ip", "ua")})
    return method, concrete, body
