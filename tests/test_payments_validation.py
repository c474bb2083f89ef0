"""The pure pieces behind POST /api/v1/payments: RFC 3339, ISO codes, exact numbers, shapes."""

from __future__ import annotations

import datetime
from decimal import Decimal

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from validation.common import (
    InvalidNumber,
    InvalidTimestamp,
    UnknownCode,
    country_code,
    currency_code,
    decimal_text,
    json_decimal,
    minor_unit_exponent,
    parse_rfc3339,
)
from validation.payment import (
    MESSAGES,
    InvalidPayment,
    PaymentShapeError,
    validate_payment,
)


def utc_ms(*args) -> int:
    return int(datetime.datetime(*args, tzinfo=datetime.UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    "text, expected_ms",
    [
        ("2026-01-31T09:30:00Z", utc_ms(2026, 1, 31, 9, 30)),
        ("2026-01-31t09:30:00z", utc_ms(2026, 1, 31, 9, 30)),
        ("2026-01-31T09:30:00.5Z", utc_ms(2026, 1, 31, 9, 30) + 500),
        ("2026-01-31T09:30:00.123456789Z", utc_ms(2026, 1, 31, 9, 30) + 123),
        ("2026-01-31T10:30:00+01:00", utc_ms(2026, 1, 31, 9, 30)),
        ("2026-01-31T04:00:00-05:30", utc_ms(2026, 1, 31, 9, 30)),
        ("2026-01-31T09:30:00-00:00", utc_ms(2026, 1, 31, 9, 30)),
        ("2026-01-01T00:30:00+01:00", utc_ms(2025, 12, 31, 23, 30)),
        ("2024-02-29T00:00:00Z", utc_ms(2024, 2, 29)),
        ("2000-02-29T00:00:00Z", utc_ms(2000, 2, 29)),
        ("1969-12-31T23:59:59.999Z", -1),
        ("2026-12-31T23:59:59+23:59", utc_ms(2026, 12, 31, 0, 0, 59)),
        # Leap seconds are real only where IERS put one; Unix time folds them into midnight.
        ("2016-12-31T23:59:60Z", utc_ms(2017, 1, 1)),
        ("2016-12-31T15:59:60.25-08:00", utc_ms(2017, 1, 1) + 250),
        ("0001-01-01T00:00:00Z", utc_ms(1, 1, 1)),
        ("9999-12-31T23:59:59Z", utc_ms(9999, 12, 31, 23, 59, 59)),
    ],
)
def test_rfc3339_accepts_section_5_6(text, expected_ms):
    assert parse_rfc3339(text) == expected_ms


@pytest.mark.parametrize(
    "value",
    [
        "2026-01-31T09:30:00",  # no offset
        "2026-01-31 09:30:00Z",  # space instead of T
        "2026-01-31",  # date only
        "09:30:00Z",  # time only
        "2026-01-31T09:30Z",  # no seconds
        "2026-1-31T09:30:00Z",
        "26-01-31T09:30:00Z",
        "2026-01-31T09:30:00.Z",  # empty fraction
        "2026-01-31T09:30:00,5Z",
        "2026-01-31T09:30:00+0100",
        "2026-01-31T09:30:00+01",
        "2026-01-31T09:30:00UTC",
        "2026-01-31T09:30:00Z ",
        " 2026-01-31T09:30:00Z",
        "2026-01-31T09:30:00Z\n",
        "２０２６-01-31T09:30:00Z",  # fullwidth digits
        "2026-02-29T00:00:00Z",  # not a leap year
        "1900-02-29T00:00:00Z",
        "2026-04-31T00:00:00Z",
        "2026-13-01T00:00:00Z",
        "2026-00-10T00:00:00Z",
        "2026-01-00T00:00:00Z",
        "2026-01-31T24:00:00Z",
        "2026-01-31T09:60:00Z",
        "2026-01-31T09:30:61Z",
        "2026-01-31T23:59:60Z",  # no leap second that day
        "2016-12-31T22:59:60Z",  # leap day, wrong minute
        "2026-01-31T09:30:00+24:00",
        "2026-01-31T09:30:00+01:60",
        "0000-01-01T00:00:00Z",
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "9999-12-31T23:59:59-01:00",  # after year 9999 in UTC
        "",
        1769851800000,
        None,
        True,
    ],
)
def test_rfc3339_refuses_everything_else(value):
    with pytest.raises(InvalidTimestamp):
        parse_rfc3339(value)


@pytest.mark.parametrize(
    "value, code",
    [("USD", "USD"), ("usd", "USD"), ("Eur", "EUR"), ("JPY", "JPY"), ("XAU", "XAU"), ("CLF", "CLF")],
)
def test_currency_codes_come_from_iso_4217(value, code):
    assert currency_code(value) == code


@pytest.mark.parametrize("value", ["US", "USDD", "ABC", "XYZ", "DEM", "", "U$D", 840, None, " USD"])
def test_currency_codes_that_do_not_exist_are_refused(value):
    with pytest.raises(UnknownCode):
        currency_code(value)


@pytest.mark.parametrize(
    "currency, exponent",
    [("USD", 2), ("EUR", 2), ("JPY", 0), ("KRW", 0), ("KWD", 3), ("BHD", 3), ("CLF", 4),
     ("usd", 2), ("XAU", None), ("XXX", None)],
)
def test_minor_unit_exponent_follows_iso_4217(currency, exponent):
    assert minor_unit_exponent(currency) == exponent


def test_minor_unit_exponent_of_a_non_code_is_a_key_error():
    with pytest.raises(KeyError):
        minor_unit_exponent("ABC")


@pytest.mark.parametrize("value, code", [("US", "US"), ("de", "DE"), ("Gb", "GB"), ("AX", "AX")])
def test_country_codes_come_from_iso_3166(value, code):
    assert country_code(value) == code


@pytest.mark.parametrize("value", ["UK", "EU", "ZZ", "USA", "U", "", 1, None])
def test_country_codes_that_are_not_assigned_are_refused(value):
    with pytest.raises(UnknownCode):
        country_code(value)


@pytest.mark.parametrize(
    "json_text, text",
    [
        (b"10", "10"),
        (b"10.10", "10.1"),
        (b"49.99", "49.99"),
        (b"0.1", "0.1"),
        (b"0.30", "0.3"),
        (b"1e2", "100"),
        (b"1.5E-3", "0.0015"),
        (b"9999999999999.99", "9999999999999.99"),
        (b"123456789.123456", "123456789.123456"),
        (b"100000000000000000000", "100000000000000000000"),
        (b"0", "0"),
        (b"-0.0", "0"),
        (b"-2.5", "-2.5"),
    ],
)
def test_json_numbers_become_the_exact_decimal_written(json_text, text):
    assert decimal_text(json_decimal(orjson.loads(json_text))) == text


@given(st.decimals(min_value=Decimal("0.01"), max_value=Decimal("9999999999999.99"), places=2))
def test_every_amount_of_up_to_15_digits_survives_orjson(amount):
    assert json_decimal(orjson.loads(str(amount).encode())) == amount


@pytest.mark.parametrize("value", [True, False, "10", None, [1], {"a": 1}, float("nan"), float("inf")])
def test_json_decimal_refuses_what_is_not_a_number(value):
    with pytest.raises(InvalidNumber):
        json_decimal(value)


BASE = {
    "payment_id": "pay_1",
    "customer": {"id": "cus_1"},
    "amount": 10,
    "currency": "USD",
    "kind": "charge",
    "paid_at": "2026-01-31T09:30:00Z",
}


@pytest.mark.parametrize(
    "body, message",
    [
        ([BASE], "invalid JSON: the body must be an object, not an array"),
        ("pay", "invalid JSON: the body must be an object, not a string"),
        (12, "invalid JSON: the body must be an object, not a number"),
        (None, "invalid JSON: the body must be an object, not null"),
        ({**BASE, "foo": 1}, 'invalid JSON: unknown field "foo"'),
        ({**BASE, "customer": {"id": "c", "foo": 1}}, 'invalid JSON: unknown field "customer.foo"'),
        ({**BASE, "subscription": {"id": "s", "foo": 1}},
         'invalid JSON: unknown field "subscription.foo"'),
        ({**BASE, "Amount": 1, "customer": {"id": "c", "e-mail": "x"}, "subscription": {"plna": "x"}},
         'invalid JSON: unknown fields "Amount", "customer.e-mail", "subscription.plna"'),
        ({"paymentid": "p", "amount": "bad"}, 'invalid JSON: unknown field "paymentid"'),
        ({**BASE, 'say "hi"': 1}, 'invalid JSON: unknown field "say \\"hi\\""'),
    ],
)
def test_shape_errors_are_invalid_json(body, message):
    with pytest.raises(PaymentShapeError) as caught:
        validate_payment(body)
    assert str(caught.value) == message


def test_metadata_keys_are_free_form():
    payment = validate_payment({**BASE, "metadata": {"foo": "1", "": "empty key"}})
    assert payment.metadata == {"foo": "1", "": "empty key"}


def test_every_message_keeps_the_spec_wording():
    # The rows of the spec's table, word for word (a typo here would be a contract change).
    assert MESSAGES["payment_id"] == "required, 1-128 chars of [A-Za-z0-9_-:.]"
    assert MESSAGES["paid_at"] == "must be RFC 3339 (a timestamp such as 2026-01-31T09:30:00Z)"
    assert parse_rfc3339("2026-01-31T09:30:00Z")  # the example is itself valid


def test_errors_are_sorted_by_plain_string_order():
    with pytest.raises(InvalidPayment) as caught:
        validate_payment({"subscription": {"status": "x"}, "customer": {"country": "zz"},
                          "paid_at": "x", "payment_id": ""})
    fields = list(caught.value.errors)
    assert fields == sorted(fields)
    assert fields == ["amount", "currency", "customer.country", "customer.id", "kind", "paid_at",
                      "payment_id", "subscription.id", "subscription.status"]


def test_defaults_of_the_spec_are_applied():
    payment = validate_payment({**BASE, "subscription": {"id": "sub_1"}})
    assert payment.status == "succeeded"
    assert payment.subscription.status == "active"
    assert payment.subscription.started_at == payment.paid_at


def test_null_means_not_given_for_optional_fields():
    body = {**BASE, "fee": None, "status": None, "metadata": None, "subscription": None,
            "customer": {"id": "c", "email": None, "country": None, "name": None}}
    payment = validate_payment(body)
    assert (payment.fee, payment.status, payment.metadata, payment.subscription) == (
        None, "succeeded", None, None)
    assert payment.customer.email is None and payment.customer.country is None
