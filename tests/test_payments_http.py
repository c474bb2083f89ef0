"""POST /api/v1/payments through the WSGI app on a real SQLite file."""

from __future__ import annotations

import copy
from dataclasses import replace
from urllib.parse import quote

import orjson
import pytest
import webtest

from app import create_app
from storage.backend import open_database
from tests.conftest import (
    FakeClock,
    WriteLock,
    bearer,
    config_for,
    fill_postgres_disk,
    free_postgres_disk,
    is_postgres,
    rows,
)
from tests.test_http_foundation import assert_envelope

URL = "/api/v1/payments"
MISSING = object()

BASE = {
    "payment_id": "pay_1",
    "customer": {"id": "cus_1"},
    "amount": 49.99,
    "currency": "USD",
    "kind": "charge",
    "paid_at": "2026-01-31T09:30:00Z",
}
FULL = {
    "payment_id": "in_1Q2w:3E.4r-5T_6y",
    "customer": {"id": "cus_9", "email": "Ada@Example.COM", "user_id": "user-42", "name": "Ada L",
                 "country": "gb", "visitor_id": "v_abc123", "metadata": {"tier": "gold"}},
    "amount": 120.5,
    "currency": "eur",
    "fee": 3.8,
    "kind": "refund",
    "paid_at": "2026-02-01T10:00:00.250+01:00",
    "status": "pending",
    "metadata": {"order": "A-17", "source": "stripe"},
    "subscription": {"id": "sub_7", "plan": "Pro", "interval": "month", "status": "trialing",
                     "amount": 29, "started_at": "2026-01-01T00:00:00Z",
                     "current_period_end": "2026-03-01T00:00:00Z",
                     "canceled_at": "2026-02-15T08:00:00Z", "ended_at": "2026-03-01T00:00:00Z"},
}


def payment(changes: dict | None = None, base: dict = BASE) -> dict:
    """A copy of base with dotted fields set (or removed with MISSING)."""
    body = copy.deepcopy(base)
    for path, value in (changes or {}).items():
        *parents, name = path.split(".")
        target = body
        for parent in parents:
            target = target.setdefault(parent, {})
        if value is MISSING:
            target.pop(name, None)
        else:
            target[name] = value
    return body


def post(client, site, body, **kwargs):
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return client.post(URL, data, headers={**bearer(site["key"]), "Content-Type": "application/json"},
                       expect_errors=True, **kwargs)


def error_message(resp) -> str:
    return assert_envelope(resp, 400, "invalid_input")["message"]


# -- success and what is stored ----------------------------------------------------------

PAYMENT_COLUMNS = "payment_id, customer_id, amount, currency, fee, kind, status, paid_at, paid_at_ms, metadata, subscription_id"


@pytest.mark.parametrize(
    "body, stored",
    [
        (BASE, {"payment_id": "pay_1", "customer_id": "cus_1", "amount": "49.99", "currency": "USD",
                "fee": None, "kind": "charge", "status": "succeeded",
                "paid_at": "2026-01-31T09:30:00Z", "paid_at_ms": 1_769_851_800_000,
                "metadata": None, "subscription_id": None}),
        (FULL, {"payment_id": "in_1Q2w:3E.4r-5T_6y", "customer_id": "cus_9", "amount": "120.5",
                "currency": "EUR", "fee": "3.8", "kind": "refund", "status": "pending",
                "paid_at": "2026-02-01T10:00:00.250+01:00", "paid_at_ms": 1_769_936_400_250,
                "metadata": '{"order":"A-17","source":"stripe"}', "subscription_id": "sub_7"}),
        (payment({"amount": 1e2, "fee": 0, "kind": "chargeback", "status": "failed",
                  "currency": "JPY", "paid_at": "2026-01-31t09:30:00z"}),
         {"payment_id": "pay_1", "customer_id": "cus_1", "amount": "100", "currency": "JPY",
          "fee": "0", "kind": "chargeback", "status": "failed", "paid_at": "2026-01-31t09:30:00z",
          "paid_at_ms": 1_769_851_800_000, "metadata": None, "subscription_id": None}),
    ],
    ids=["minimal", "every-field", "defaults-and-edges"],
)
def test_valid_payment_is_answered_200_and_stored(client, site, db_path, body, stored):
    resp = post(client, site, body)
    assert resp.status_int == 200
    assert resp.json == {"ok": True, "data": {"payment_id": body["payment_id"]}}
    assert rows(db_path, f"SELECT {PAYMENT_COLUMNS} FROM payments") == [stored]  # noqa: S608 - fixed columns


def test_amount_is_stored_as_the_digits_sent(client, site, db_path):
    raw = orjson.dumps(payment({"amount": 0})).replace(b'"amount":0', b'"amount":10.10')
    assert post(client, site, raw).status_int == 200
    assert rows(db_path, "SELECT amount FROM payments") == [{"amount": "10.1"}]
    type_of = "pg_typeof(amount)::text" if is_postgres(db_path) else "typeof(amount)"
    assert rows(db_path, f"SELECT {type_of} AS t FROM payments") == [{"t": "text"}]  # noqa: S608 - fixed spellings


def test_customer_and_subscription_are_stored(client, site, db_path):
    assert post(client, site, FULL).status_int == 200
    [customer] = rows(db_path, "SELECT customer_id, email, user_id, visitor_id, name, country,"
                               " metadata FROM customers")
    assert customer == {"customer_id": "cus_9", "email": "ada@example.com", "user_id": "user-42",
                        "visitor_id": "v_abc123", "name": "Ada L", "country": "GB",
                        "metadata": '{"tier":"gold"}'}
    state = ("subscription_id, customer_id, payment_id, effective_at_ms, currency, plan, interval,"
             " status, amount, started_at, started_at_ms, current_period_end, canceled_at, ended_at,"
             " ended_at_ms")
    expected = {"subscription_id": "sub_7", "customer_id": "cus_9", "payment_id": FULL["payment_id"],
                "effective_at_ms": 1_769_936_400_250, "currency": "EUR", "plan": "Pro",
                "interval": "month", "status": "trialing", "amount": "29",
                "started_at": "2026-01-01T00:00:00Z", "started_at_ms": 1_767_225_600_000,
                "current_period_end": "2026-03-01T00:00:00Z", "canceled_at": "2026-02-15T08:00:00Z",
                "ended_at": "2026-03-01T00:00:00Z", "ended_at_ms": 1_772_323_200_000}
    assert rows(db_path, f"SELECT {state} FROM subscriptions") == [expected]  # noqa: S608 - fixed columns
    assert rows(db_path, f"SELECT {state} FROM subscription_observations") == [expected]  # noqa: S608 - fixed columns


def test_subscription_defaults_to_active_from_paid_at(client, site, db_path):
    assert post(client, site, payment({"subscription": {"id": "sub_1"}})).status_int == 200
    assert rows(db_path, "SELECT status, started_at, started_at_ms, amount FROM subscriptions") == [
        {"status": "active", "started_at": "2026-01-31T09:30:00Z",
         "started_at_ms": 1_769_851_800_000, "amount": None}]


def test_request_connection_commits_with_synchronous_full(tally, db_path):
    if not is_postgres(db_path):
        assert tally.db.conn().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        return
    # A COMMIT waits for the WAL on disk, even when the URL (or the server) turns that off.
    careless = db_path.replace("options=", "options=" + quote("-csynchronous_commit=off "))
    for db in (tally.db, open_database(config_for(careless))):
        assert db.conn().raw.execute("SHOW synchronous_commit").fetchone()[0] == "on"
        db.close()


# -- the spec's message table -------------------------------------------------------------

ID_RULE = "required, 1-128 chars of [A-Za-z0-9_-:.]"
RFC3339 = "must be RFC 3339"
PAID_AT = "must be RFC 3339 (a timestamp such as 2026-01-31T09:30:00Z)"

# (dotted field, invalid values, message): every row of the spec's table, then ours.
MESSAGE_TABLE = [
    ("payment_id", [MISSING, None, "", "a" * 129, "pay 1", "pay/1", "päy", "pay\n", 17],
     ID_RULE),
    ("customer.id", [MISSING, None, "", "c" * 129, "cus#1", ["c"]], ID_RULE),
    ("customer.email", ["ada.example.com", "", 5, "a" * 320 + "@x"], "must be an email address"),
    ("customer.country", ["UK", "XX", "USA", "", 1], "must be ISO 3166-1 alpha-2"),
    ("amount", [MISSING, None, 0, -1, -0.01, "10", True, [10], {"v": 1}], "must be greater than 0"),
    ("fee", [-0.01, -5, "1", False], "must not be negative"),
    ("currency", [MISSING, None, "US", "USDX", "ABC", "€", 978], "must be a 3-letter ISO 4217 code"),
    ("kind", [MISSING, None, "Charge", "payment", "", 1], "must be one of charge, refund, chargeback"),
    ("paid_at", [MISSING, None, "2026-01-31", "2026-01-31T09:30:00", "2026-02-30T00:00:00Z",
                 "2026-01-31 09:30:00Z", 1769851800000, "yesterday"], PAID_AT),
    ("status", ["paid", "SUCCEEDED", "", 1], "must be one of succeeded, pending, failed"),
    ("subscription.id", [MISSING, None, "", "s" * 129, "sub 1"], "required when subscription is set"),
    ("subscription.interval", ["monthly", "", 30], "must be one of day, week, month, year"),
    ("subscription.status", ["cancelled", "Active", 1],
     "must be one of active, trialing, past_due, paused, canceled, ended"),
    ("subscription.amount", [-1, -0.5, "29", True], "must not be negative"),
    ("subscription.started_at", ["2026-01-01", "2026-01-01T00:00:00", 0], RFC3339),
    ("subscription.current_period_end", ["2026-02-30T00:00:00Z", "soon"], RFC3339),
    ("subscription.canceled_at", ["2026-01-31T25:00:00Z", False], RFC3339),
    ("subscription.ended_at", ["2026-01-31T09:30:00+25:00", ""], RFC3339),
    # Fields the table leaves out: our messages, same style.
    ("customer", [MISSING, None, "cus_1", ["cus_1"], 1], "required, must be an object"),
    ("subscription", ["sub_1", ["sub_1"], 1, True], "must be an object"),
    ("metadata", [{"n": 1}, {"a": {"b": "c"}}, {"a": None}, ["x"], "x"],
     "must be an object whose values are strings"),
    ("customer.metadata", [{"n": 1}, "x"], "must be an object whose values are strings"),
    ("customer.name", ["n" * 201, 1], "must be a string of at most 200 characters"),
    ("customer.user_id", ["", "u" * 129, "é" * 65, 42], "must be a string of 1-128 bytes"),
    ("customer.visitor_id", ["", "v" * 129, 42], "must be a string of 1-128 bytes"),
    ("subscription.plan", ["p" * 201, 1], "must be a string of at most 200 characters"),
]
CASES = [
    pytest.param(field, value, message, id=f"{field}-{index}")
    for field, values, message in MESSAGE_TABLE
    for index, value in enumerate(values)
]


def base_for(field: str) -> dict:
    return payment({"subscription": {"id": "sub_1"}}) if field.startswith("subscription.") else BASE


@pytest.fixture(scope="module")
def refusing_apps(module_database):
    """An app, site and key per backend for the module's refusal tables. A refused payment
    stores nothing, so their hundreds of cases share one (each checks nothing was stored)."""
    made = {}

    def on(backend: str):
        if backend not in made:
            db = module_database(backend)
            tally = create_app(config_for(db), clock=FakeClock())
            account = tally.directory.create_account("Refusals", "free")
            site = tally.directory.create_site(account["id"], ["example.com", "www.example.com"])
            key = tally.directory.create_key(site["id"], ["events", "payments", "read"])
            made[backend] = (tally, db, webtest.TestApp(tally),
                             {"account": account, "site": site, "key": key["key"],
                              "key_id": key["id"]})
        return made[backend][1:]

    yield on
    for tally, *_ in made.values():
        tally.stop(timeout=5)


@pytest.fixture
def refusing(refusing_apps, backend):
    """(database, client, site) shared by the refusal tests of one backend."""
    return refusing_apps(backend)


@pytest.mark.parametrize("field, value, message", CASES)
def test_each_invalid_field_gets_its_message(refusing, field, value, message):
    db_path, client, site = refusing
    resp = post(client, site, payment({field: value}, base=base_for(field)))
    assert error_message(resp) == f"invalid payment input: {field}: {message}"
    assert rows(db_path, "SELECT count(*) AS n FROM payments") == [{"n": 0}]


@pytest.mark.parametrize(
    "field, value",
    [("payment_id", "a" * 128), ("payment_id", "A-z_0:9.x"), ("customer.id", "c"),
     ("customer.email", "a@b"), ("customer.country", "us"), ("amount", 0.01), ("amount", 1e-9),
     ("fee", 0), ("currency", "jpy"), ("subscription.amount", 0), ("subscription.plan", ""),
     ("customer.user_id", "é" * 64), ("customer.name", ""), ("customer.name", "n" * 200),
     ("paid_at", "2016-12-31T23:59:60Z"), ("metadata", {})],
)
def test_values_at_the_edges_are_accepted(client, site, field, value):
    assert post(client, site, payment({field: value}, base=base_for(field))).status_int == 200


def test_all_errors_in_one_message_sorted_by_field(client, site):
    body = {"payment_id": "bad id", "customer": {"id": "", "email": "nope", "country": "ZZ"},
            "amount": "10", "currency": "usdollar", "fee": -1, "kind": "sale",
            "paid_at": "2026-01-31T09:30:00", "status": "done", "metadata": {"a": 1},
            "subscription": {"interval": "fortnight", "status": "gone", "amount": -2,
                             "started_at": "x", "current_period_end": "y", "canceled_at": "z",
                             "ended_at": "w"}}
    assert error_message(post(client, site, body)) == (
        "invalid payment input: "
        "amount: must be greater than 0; "
        "currency: must be a 3-letter ISO 4217 code; "
        "customer.country: must be ISO 3166-1 alpha-2; "
        "customer.email: must be an email address; "
        f"customer.id: {ID_RULE}; "
        "fee: must not be negative; "
        "kind: must be one of charge, refund, chargeback; "
        "metadata: must be an object whose values are strings; "
        f"paid_at: {PAID_AT}; "
        f"payment_id: {ID_RULE}; "
        "status: must be one of succeeded, pending, failed; "
        "subscription.amount: must not be negative; "
        "subscription.canceled_at: must be RFC 3339; "
        "subscription.current_period_end: must be RFC 3339; "
        "subscription.ended_at: must be RFC 3339; "
        "subscription.id: required when subscription is set; "
        "subscription.interval: must be one of day, week, month, year; "
        "subscription.started_at: must be RFC 3339; "
        "subscription.status: must be one of active, trialing, past_due, paused, canceled, ended"
    )


# -- malformed JSON and unknown fields ------------------------------------------------------

@pytest.mark.parametrize(
    "raw, message",
    [
        (b"", "invalid JSON: Input is a zero-length, empty document: line 1 column 1 (char 0)"),
        (b"{", None),
        (b'{"payment_id": "p",}', None),
        (b"{'payment_id': 'p'}", None),
        (b'{"amount": NaN}', None),
        (b'{"a": 1} {"b": 2}', None),
        (b"\xff\xfe{}", None),
        (b"[]", "invalid JSON: the body must be an object, not an array"),
        (b'"payment"', "invalid JSON: the body must be an object, not a string"),
        (b"null", "invalid JSON: the body must be an object, not null"),
        (orjson.dumps({**BASE, "foo": 1}), 'invalid JSON: unknown field "foo"'),
        (orjson.dumps(payment({"customer.foo": 1})), 'invalid JSON: unknown field "customer.foo"'),
        (orjson.dumps(payment({"subscription": {"id": "s", "foo": 1}})),
         'invalid JSON: unknown field "subscription.foo"'),
        (orjson.dumps(payment({"customer.Email": "a@b", "amount": "bad"})),
         'invalid JSON: unknown field "customer.Email"'),
    ],
)
def test_malformed_json_and_unknown_fields_are_invalid_json(refusing, raw, message):
    db_path, client, site = refusing
    got = error_message(post(client, site, raw))
    assert got.startswith("invalid JSON: ")
    if message:
        assert got == message
    assert rows(db_path, "SELECT count(*) AS n FROM payments") == [{"n": 0}]


def test_malformed_json_message_names_the_position(client, site):
    assert "line 1 column" in error_message(post(client, site, b'{"payment_id": "p",}'))


# -- size limit ---------------------------------------------------------------------------

def body_of_size(size: int, payment_id: str = "pay_big") -> bytes:
    template = payment({"payment_id": payment_id, "metadata": {"pad": ""}})
    empty = orjson.dumps(template)
    template["metadata"]["pad"] = "x" * (size - len(empty))
    data = orjson.dumps(template)
    assert len(data) == size
    return data


def test_body_of_exactly_64_kib_is_accepted(client, site, db_path):
    resp = post(client, site, body_of_size(65_536))
    assert resp.status_int == 200
    assert len(rows(db_path, "SELECT metadata FROM payments")[0]["metadata"]) > 65_000


def test_body_one_byte_over_64_kib_is_refused_413(client, site, db_path):
    error = assert_envelope(post(client, site, body_of_size(65_537)), 413, "invalid_input")
    assert error["message"] == "request body is larger than 65536 bytes"
    assert rows(db_path, "SELECT count(*) AS n FROM payments") == [{"n": 0}]


# -- keys and scopes ---------------------------------------------------------------------

def test_key_without_payments_scope_is_403(client, site, directory):
    events_only = directory.create_key(site["site"]["id"], ["events"])["key"]
    resp = post(client, {"key": events_only}, BASE)
    assert assert_envelope(resp, 403, "forbidden")["message"] == "this API key lacks the payments scope"


def test_missing_key_is_401_before_the_body_is_read(client):
    resp = client.post(URL, b"{" * 70_000, expect_errors=True)
    assert_envelope(resp, 401, "unauthorized")


def test_payment_belongs_to_the_keys_site(client, site, directory, db_path):
    other_site = directory.create_site(site["account"]["id"], ["other.test"])
    other_key = directory.create_key(other_site["id"], ["payments"])["key"]
    assert post(client, site, BASE).status_int == 200
    assert post(client, {"key": other_key}, BASE).status_int == 200
    stored = rows(db_path, "SELECT s.public_id AS site FROM payments p JOIN sites s"
                           " ON s.id = p.site_id ORDER BY s.public_id")
    assert sorted(r["site"] for r in stored) == sorted([site["site"]["id"], other_site["id"]])


def test_get_is_405(client, site):
    resp = client.get(URL, headers=bearer(site["key"]), expect_errors=True)
    assert_envelope(resp, 405, "method_not_allowed")


# -- upsert ------------------------------------------------------------------------------

def test_same_payment_id_updates_instead_of_adding(client, site, db_path):
    assert post(client, site, payment({"subscription": {"id": "sub_1"}})).status_int == 200
    changed = payment({"amount": 12, "status": "failed", "fee": 1.5,
                       "subscription": {"id": "sub_1", "status": "past_due"}})
    resp = post(client, site, changed)
    assert resp.json == {"ok": True, "data": {"payment_id": "pay_1"}}
    assert rows(db_path, "SELECT payment_id, amount, status, fee FROM payments") == [
        {"payment_id": "pay_1", "amount": "12", "status": "failed", "fee": "1.5"}]
    assert rows(db_path, "SELECT status FROM subscription_observations") == [{"status": "past_due"}]
    assert rows(db_path, "SELECT status FROM subscriptions") == [{"status": "past_due"}]
    assert rows(db_path, "SELECT count(*) AS n FROM customers") == [{"n": 1}]


def test_repeating_the_exact_request_changes_nothing(client, site, db_path, clock):
    assert post(client, site, FULL).status_int == 200
    before = rows(db_path, "SELECT * FROM payments")
    clock.advance(60)
    assert post(client, site, FULL).status_int == 200
    after = rows(db_path, "SELECT * FROM payments")
    assert [{**r, "updated_at": None} for r in after] == [{**r, "updated_at": None} for r in before]
    assert after[0]["updated_at"] == before[0]["updated_at"] + 60_000
    assert rows(db_path, "SELECT count(*) AS n FROM subscription_observations") == [{"n": 1}]


def test_resent_payment_without_subscription_drops_its_observation(client, site, db_path):
    assert post(client, site, payment({"subscription": {"id": "sub_1"}})).status_int == 200
    assert post(client, site, BASE).status_int == 200
    assert rows(db_path, "SELECT subscription_id FROM payments") == [{"subscription_id": None}]
    assert rows(db_path, "SELECT count(*) AS n FROM subscription_observations") == [{"n": 0}]
    assert rows(db_path, "SELECT count(*) AS n FROM subscriptions") == [{"n": 0}]


def test_subscription_keeps_the_state_of_its_latest_payment(client, site, db_path):
    newer = payment({"payment_id": "pay_2", "paid_at": "2026-03-01T00:00:00Z",
                     "subscription": {"id": "sub_1", "status": "canceled", "amount": 10}})
    older = payment({"payment_id": "pay_1", "paid_at": "2026-02-01T00:00:00Z",
                     "subscription": {"id": "sub_1", "status": "active", "amount": 10}})
    assert post(client, site, newer).status_int == 200
    assert post(client, site, older).status_int == 200  # a late retry of an older payment
    assert rows(db_path, "SELECT status, payment_id FROM subscriptions") == [
        {"status": "canceled", "payment_id": "pay_2"}]
    assert rows(db_path, "SELECT payment_id, status, effective_at_ms FROM subscription_observations"
                         " ORDER BY effective_at_ms") == [
        {"payment_id": "pay_1", "status": "active", "effective_at_ms": 1_769_904_000_000},
        {"payment_id": "pay_2", "status": "canceled", "effective_at_ms": 1_772_323_200_000}]
    # Moving the newer payment's block to another subscription leaves sub_1 with the older one.
    moved = payment({"payment_id": "pay_2", "paid_at": "2026-03-01T00:00:00Z",
                     "subscription": {"id": "sub_2"}})
    assert post(client, site, moved).status_int == 200
    assert rows(db_path, "SELECT subscription_id, status, payment_id FROM subscriptions"
                         " ORDER BY subscription_id") == [
        {"subscription_id": "sub_1", "status": "active", "payment_id": "pay_1"},
        {"subscription_id": "sub_2", "status": "active", "payment_id": "pay_2"}]


def test_customer_fields_merge_by_paid_at(client, site, db_path):
    first = payment({"payment_id": "p1", "paid_at": "2026-02-01T00:00:00Z",
                     "customer": {"id": "cus_1", "email": "old@x.test", "name": "Old"}})
    newer = payment({"payment_id": "p2", "paid_at": "2026-03-01T00:00:00Z",
                     "customer": {"id": "cus_1", "email": "new@x.test"}})
    older = payment({"payment_id": "p0", "paid_at": "2026-01-01T00:00:00Z",
                     "customer": {"id": "cus_1", "email": "older@x.test", "country": "FR"}})
    for body in (first, newer, older):
        assert post(client, site, body).status_int == 200
    assert rows(db_path, "SELECT email, name, country FROM customers") == [
        {"email": "new@x.test", "name": "Old", "country": "FR"}]


# -- storage failures --------------------------------------------------------------------

@pytest.fixture
def impatient(config, clock):
    """An app whose request connection waits only 100 ms for the write lock."""
    app = create_app(config, db=open_database(replace(config, busy_timeout_ms=100)), clock=clock)
    account = app.directory.create_account("Busy", "free")
    site = app.directory.create_site(account["id"], ["busy.test"])
    key = app.directory.create_key(site["id"], ["payments"])["key"]
    yield webtest.TestApp(app), {"key": key}
    app.stop(timeout=5)


@pytest.mark.parametrize("holds_turn", [False, True], ids=["outside-writer", "tally-writer"])
def test_locked_database_is_503_with_retry_after_then_retry_succeeds(impatient, db_path,
                                                                       holds_turn):
    client, site = impatient
    blocker = WriteLock(db_path, turn=holds_turn)
    try:
        resp = post(client, site, BASE)
        error = assert_envelope(resp, 503, "rate_limited")
        assert resp.headers["Retry-After"] == "2"
        assert error["message"] == "the database is busy; retry after 2 seconds"
    finally:
        blocker.release()
    assert rows(db_path, "SELECT count(*) AS n FROM payments") == [{"n": 0}]
    assert post(client, site, BASE).status_int == 200
    assert rows(db_path, "SELECT payment_id FROM payments") == [{"payment_id": "pay_1"}]


def fill_the_disk(tally, db_path) -> None:
    """Writes fail as on a full disk: SQLite's file may not grow (on the request thread's
    connection: webtest runs in this thread); PostgreSQL, which has no such limit per
    session, refuses the payment's last write with disk_full, as its full disk does."""
    if is_postgres(db_path):
        fill_postgres_disk(db_path, ("subscriptions",))
        return
    for conn in (tally.db.conn(), tally.payments.group.connection()):  # the payment writer's
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {int(pages)}")  # noqa: S608 - an int we just read


def free_the_disk(tally, db_path) -> None:
    if is_postgres(db_path):
        free_postgres_disk(db_path, ("subscriptions",))
    else:
        for conn in (tally.db.conn(), tally.payments.group.connection()):
            conn.execute("PRAGMA max_page_count = 1073741823")


def test_full_database_is_500_and_nothing_half_written(tally, client, site, db_path, caplog):
    fill_the_disk(tally, db_path)
    big = payment({"metadata": {"pad": "x" * 20_000}, "subscription": {"id": "sub_1"}})
    resp = post(client, site, big)
    error = assert_envelope(resp, 500, "internal_error")
    assert error["message"] == "the payment could not be stored; retry later"
    assert "storing payment pay_1" in caplog.text
    for table in ("payments", "customers", "subscriptions", "subscription_observations"):
        assert rows(db_path, f"SELECT count(*) AS n FROM {table}") == [{"n": 0}]  # noqa: S608 - fixed names
    free_the_disk(tally, db_path)
    assert post(client, site, big).status_int == 200
    assert rows(db_path, "SELECT count(*) AS n FROM payments") == [{"n": 1}]
