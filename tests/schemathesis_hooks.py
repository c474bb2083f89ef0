"""Schemathesis hooks for tests/test_fuzz.py (loaded through SCHEMATHESIS_HOOKS).

Random site ids and hostnames would stop nearly every generated event at 404 or 400,
so positive cases are pointed at the test's real site (FUZZ_SITE_ID, FUZZ_HOST) and
payments at currencies and countries that exist. Negative cases are left alone: a
rewrite could make them valid.
"""

from __future__ import annotations

import os
import re

import schemathesis
from schemathesis import GenerationMode

CURRENCIES = ("EUR", "USD", "JPY", "KWD", "GBP", "CHF")
COUNTRIES = ("DE", "US", "FR", "JP", "GB", "CH")
_URL = re.compile(r"([hH][tT][tT][pP][sS]?://)[^/?#]*(.*)", re.DOTALL)


@schemathesis.hook
def map_case(ctx, case):
    meta = case.meta
    if meta is None or meta.generation.mode != GenerationMode.POSITIVE:
        return case
    if not isinstance(case.body, dict):
        return case
    if case.path in ("/api/v1/events", "/api/v1/collect"):
        _point_events_at_the_site(case.body)
    elif case.path == "/api/v1/payments":
        _real_codes(case.body)
    return case


def _point_events_at_the_site(body: dict) -> None:
    site, host = os.environ["FUZZ_SITE_ID"], os.environ["FUZZ_HOST"]
    if isinstance(body.get("s"), str):
        body["s"] = site
    for event in body.get("b", [body]) if isinstance(body.get("b", []), list) else []:
        if not isinstance(event, dict):
            continue
        if isinstance(event.get("s"), str):
            event["s"] = site
        url = event.get("u")
        match = _URL.fullmatch(url) if isinstance(url, str) else None
        if match:
            pointed = match.group(1) + host + match.group(2)
            if len(pointed.encode()) <= 2048:
                event["u"] = pointed


def _real_codes(body: dict) -> None:
    pick = len(str(body.get("payment_id", "")))
    if isinstance(body.get("currency"), str):
        body["currency"] = CURRENCIES[pick % len(CURRENCIES)]
    customer = body.get("customer")
    if isinstance(customer, dict) and isinstance(customer.get("country"), str):
        customer["country"] = COUNTRIES[pick % len(COUNTRIES)]
