"""Property tests: no JSON value breaks a validator, no body breaks an endpoint.

Validators take what orjson parses: null, booleans, integers from -2**63 to 2**64-1,
finite floats, strings (no lone surrogates), arrays and objects. For any such value a
validator returns a cleaned value or raises its own named exception; either endpoint
answers any body with 2xx, or 4xx and the error envelope. `make fuzz` runs these with
FUZZ_EXAMPLES (random, many examples); `make test` runs a fixed, modest set.
"""

from __future__ import annotations

import os

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from api.errors import CODES_BY_STATUS
from tests.conftest import bearer
from tests.routes import event as sample_event
from tests.routes import payment as sample_payment
from validation.event import CleanEvent, InvalidEvent, parse_events
from validation.payment import Payment, PaymentInputError, validate_payment

FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0"))


def budget(examples: int):
    """A fixed, derandomized run in `make test`; a random long one under `make fuzz`."""
    return settings(
        max_examples=FUZZ_EXAMPLES or examples,
        derandomize=not FUZZ_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.function_scoped_fixture],
    )


scalars = (
    st.none() | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
    | st.sampled_from(["", "0", "10", "-1", "pageview", "$identify", "charge", "EUR", "US",
                       "2026-09-21T12:00:00Z", "https://example.com/", "a@b", "\x00", "203.0.113.7"])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=30,
)


def mutated(template: dict, keys: list[str]) -> st.SearchStrategy:
    """The template with some fields dropped, replaced by any JSON value, or added."""
    def build(choices):
        body = dict(template)
        for key, action, value in choices:
            if action == "drop":
                body.pop(key, None)
            else:
                body[key] = value
        return body

    change = st.tuples(st.sampled_from(keys + ["zz", "S", "customer.x"]),
                       st.sampled_from(["drop", "set"]), json_values)
    return st.lists(change, max_size=4).map(build)


PAYMENT_KEYS = ["payment_id", "customer", "amount", "currency", "fee", "kind", "paid_at",
                "status", "metadata", "subscription"]
CUSTOMER_KEYS = ["id", "email", "user_id", "name", "country", "visitor_id", "metadata"]
SUBSCRIPTION_KEYS = ["id", "plan", "interval", "status", "amount", "started_at",
                     "current_period_end", "canceled_at", "ended_at"]
EVENT_KEYS = ["s", "e", "u", "r", "t", "w", "l", "uid", "p", "ts", "ip", "ua", "b"]

payments = st.builds(
    lambda body, customer, subscription: {**body, "customer": customer, "subscription": subscription},
    mutated(sample_payment(), PAYMENT_KEYS),
    mutated(sample_payment()["customer"], CUSTOMER_KEYS),
    mutated(sample_payment()["subscription"], SUBSCRIPTION_KEYS),
) | mutated(sample_payment(), PAYMENT_KEYS) | json_values


def events_for(site: str) -> st.SearchStrategy:
    single = mutated(sample_event(site), EVENT_KEYS)
    batch = st.lists(single, min_size=0, max_size=4).map(lambda b: {"s": site, "b": b})
    return single | batch | mutated({"s": site, "b": [sample_event(site)]}, ["s", "b"]) | json_values


# Validators --------------------------------------------------------------------


@budget(400)
@given(payments)
def test_payment_validation_returns_or_raises_its_own_error(body):
    try:
        result = validate_payment(orjson.loads(orjson.dumps(body)))
    except PaymentInputError as exc:
        message = str(exc)
        assert message.startswith(("invalid JSON:", "invalid payment input: ")), message
        event(message.split(":")[0])
    else:
        event("valid")
        assert isinstance(result, Payment) and result.amount > 0


@budget(400)
@given(events_for("site_abc"))
def test_event_validation_returns_or_raises_its_own_error(body):
    try:
        site, events = parse_events(orjson.loads(orjson.dumps(body)), 1_790_000_000_000)
    except InvalidEvent as exc:
        assert str(exc).startswith("invalid event input: ")
        event("invalid")
    else:
        event("valid")
        assert isinstance(site, str) and site
        assert 1 <= len(events) <= 50 and all(isinstance(e, CleanEvent) for e in events)


# Endpoints ---------------------------------------------------------------------


@pytest.fixture
def world(db_path):
    """One app on the test's database for every example of the test."""
    import webtest

    from app import create_app
    from tests.conftest import FakeClock, config_for

    tally = create_app(config_for(db_path, queue_max=100_000), clock=FakeClock())
    account = tally.directory.create_account("P", "scale")
    site = tally.directory.create_site(account["id"], ["example.com"])
    key = tally.directory.create_key(site["id"], ["events", "payments", "read"])
    yield {"client": webtest.TestApp(tally), "site": site["id"], "key": key["key"]}
    tally.stop(timeout=5)


def assert_answer(resp, success: int) -> None:
    status = resp.status_int
    event(f"status {status}")
    assert status == success or 400 <= status < 500, (status, resp.body[:300])
    if status == success:
        return
    assert resp.content_type == "application/json"
    body = orjson.loads(resp.body)
    assert set(body) == {"ok", "error"} and body["ok"] is False
    assert set(body["error"]) == {"code", "message"} and body["error"]["message"]
    assert body["error"]["code"] == CODES_BY_STATUS[status]


raw_bodies = (
    json_values.map(orjson.dumps)
    | st.binary(max_size=300)
    | st.sampled_from([b"", b"{", b"[]", b"null", b'{"a":1}{', b"\xff\xfe", b"[" * 70 + b"]" * 70,
                       b'{"payment_id": "x"' + b" " * 70_000 + b"}"])
)


@budget(200)
@given(body=payments.map(orjson.dumps) | raw_bodies)
def test_payments_answer_any_body_with_2xx_or_the_envelope(world, body):
    resp = world["client"].post("/api/v1/payments", body, expect_errors=True, headers={
        **bearer(world["key"]), "Content-Type": "application/json"})
    assert_answer(resp, 200)
    if resp.status_int == 200:
        assert set(resp.json) == {"ok", "data"} and resp.json["ok"] is True


@budget(200)
@given(data=st.data())
def test_events_answer_any_body_with_2xx_or_the_envelope(world, data):
    body = data.draw(events_for(world["site"]).map(orjson.dumps) | raw_bodies)
    resp = world["client"].post("/api/v1/events", body, expect_errors=True, headers={
        **bearer(world["key"]), "Content-Type": "application/json"})
    assert_answer(resp, 204)
    if resp.status_int == 204:
        assert resp.body == b""


# Report parameters -------------------------------------------------------------

param_values = (
    st.text(max_size=12)
    | st.dates().map(str)
    | st.integers(min_value=-5, max_value=2000).map(str)
    | st.sampled_from(["", "0001-01-01", "9999-12-31", "2026-02-30", "channel", "page"])
)
report_params = st.dictionaries(
    st.sampled_from(["from", "to", "at", "by", "limit"]) | st.text(max_size=6),
    param_values | st.lists(param_values, min_size=2, max_size=3),
    max_size=4,
)


@budget(400)
@given(report_params, st.dates())
def test_report_parameters_parse_or_raise_their_own_error(params, today):
    from reports.shared.params import (
        InvalidReportParameter,
        check_known,
        parse_at,
        parse_date_range,
        parse_dimension,
        parse_limit,
    )

    for parse in (lambda: parse_date_range(params, today), lambda: parse_at(params, today),
                  lambda: parse_limit(params), lambda: parse_dimension(params),
                  lambda: check_known(params, ("from", "to"))):
        try:
            parse()
        except InvalidReportParameter as exc:
            assert str(exc)
