"""POST /api/v1/integrations/stripe/{site_id} through the real app and SQLite file, with
the secret set by the real `tally stripe` command and requests signed as Stripe signs them.

The signature's timestamp is checked by the stripe library against the machine's clock,
so requests are signed with the real time; the objects' own times are the scenario's.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from decimal import Decimal

import pytest
import webtest

import metrics
from app import create_app
from storage.backend import open_database
from tests.conftest import WAIT, WriteLock, bearer, http, rows, run_cli
from tests.stripe_events import (
    FIXTURES,
    SECRET,
    body,
    charge,
    dispute,
    invoice,
    invoice_line,
    price,
    refund,
    sign,
    stripe_event,
    stripe_object,
    subscription,
    unix,
)
from tests.test_metrics import sample

URL = "/api/v1/integrations/stripe/{}"
METRICS_TOKEN = "metrics-token-0123456789"
UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"


def set_secret(db_path: str, site_id: str, secret: str = SECRET):
    return run_cli("stripe", "set-secret", "--site", site_id, "--json", db=db_path,
                   input_text=secret + "\n")


class Stripe:
    """Delivers events to one site's webhook URL."""

    def __init__(self, client: webtest.TestApp, site_id: str, secret: str = SECRET):
        self.client, self.site_id, self.secret = client, site_id, secret

    def post(self, event: dict, *, status: int = 200, secret: str | None = None,
             timestamp: int | None = None, site_id: str | None = None,
             signature: str | None = None):
        payload = body(event)
        header = signature if signature is not None else sign(
            payload, secret or self.secret, timestamp)
        headers = {"Content-Type": "application/json"}
        if header:
            headers["Stripe-Signature"] = header
        resp = self.client.post(URL.format(site_id or self.site_id), payload, headers=headers,
                                expect_errors=True)
        assert resp.status_int == status, resp.body
        return resp.json

    def send(self, event_type: str, obj: dict, at: str, **kwargs) -> str:
        event = stripe_event(event_type, obj, created=unix(at), **kwargs)
        return self.post(event)["data"]["status"]


@pytest.fixture
def stripe_site(tally, client, site, db_path):
    out = set_secret(db_path, site["site"]["id"])
    assert SECRET not in out.stdout + out.stderr
    return Stripe(client, site["site"]["id"])


def read(client, site, path: str) -> dict:
    resp = client.get(path, headers=bearer(site["key"]))
    return json.loads(resp.body, parse_float=Decimal)["data"]


# The secret -------------------------------------------------------------------------------

def test_set_secret_reads_stdin_and_shows_only_a_fingerprint(db_path, site, tally):
    site_id = site["site"]["id"]
    out = set_secret(db_path, site_id)
    data = json.loads(out.stdout)
    assert data["site"] == site_id and data["fingerprint"].startswith("sha256:")
    assert SECRET not in out.stdout + out.stderr and SECRET[6:] not in out.stdout
    human = run_cli("stripe", "set-secret", "--site", site_id, db=db_path, input_text=SECRET)
    assert data["fingerprint"] in human.stdout and SECRET[6:] not in human.stdout
    bad = run_cli("stripe", "set-secret", "--site", site_id, db=db_path, check=False,
                  input_text="sk_live_" + "x" * 20)
    assert bad.returncode == 1 and "x" * 20 not in bad.stderr and "whsec_" in bad.stderr
    removed = json.loads(run_cli("stripe", "remove", "--site", site_id, "--json", db=db_path).stdout)
    assert removed == {"site": site_id, "removed": True}
    again = json.loads(run_cli("stripe", "remove", "--site", site_id, "--json", db=db_path).stdout)
    assert again["removed"] is False
    unknown = run_cli("stripe", "remove", "--site", "site_nope", db=db_path, check=False)
    assert unknown.returncode == 1 and "no site site_nope" in unknown.stderr


def test_a_removed_secret_refuses_the_next_event(stripe_site, db_path):
    ok = stripe_event("charge.succeeded", charge("ch_1", 100, customer="cus_1",
                                                 created="2026-09-21"), created=unix("2026-09-21"))
    stripe_site.post(ok)
    run_cli("stripe", "remove", "--site", stripe_site.site_id, db=db_path)
    error = stripe_site.post({**ok, "id": "evt_2"}, status=400)["error"]
    assert error == {"code": "invalid_input",
                     "message": f"no Stripe webhook secret is set for site {stripe_site.site_id}"}


# Refusals -------------------------------------------------------------------------------

def _event():
    return stripe_event("charge.succeeded", charge("ch_1", 4999, customer="cus_1",
                                                   created="2026-09-21"), created=unix("2026-09-21"))


@pytest.mark.parametrize("case, message", [
    ("missing", "missing Stripe-Signature header"),
    ("other secret", "Stripe-Signature does not match this site's webhook secret"),
    ("garbage", "Stripe-Signature does not match this site's webhook secret"),
    ("tampered", "Stripe-Signature does not match this site's webhook secret"),
    ("old", "Stripe-Signature timestamp is more than 300 seconds old"),
    ("a year ahead", "Stripe-Signature timestamp is more than 300 seconds in the future"),
    ("just ahead", "Stripe-Signature timestamp is more than 300 seconds in the future"),
])
def test_bad_signatures_are_400_and_store_nothing(stripe_site, db_path, case, message):
    event = _event()
    kwargs = {
        "missing": {"signature": ""},
        "other secret": {"secret": "whsec_someoneelse"},
        "garbage": {"signature": "t=abc,v1=zz"},
        "tampered": {"signature": sign(body({**event, "id": "evt_other"}))},
        "old": {"timestamp": int(time.time()) - 301},
        "a year ahead": {"timestamp": int(time.time()) + 365 * 86_400},
        "just ahead": {"timestamp": int(time.time()) + 330},
    }[case]
    error = stripe_site.post(event, status=400, **kwargs)["error"]
    assert error == {"code": "invalid_input", "message": message}
    assert SECRET[6:] not in json.dumps(error)
    assert rows(db_path, "SELECT count(*) AS n FROM payments") == [{"n": 0}]


def test_a_signature_for_one_site_is_refused_on_another(tally, client, directory, db_path, site):
    other = directory.create_site(site["account"]["id"], ["other.example"])
    set_secret(db_path, site["site"]["id"])
    a = Stripe(client, site["site"]["id"])
    error = a.post(_event(), status=400, site_id=other["id"])["error"]
    assert error["message"] == f"no Stripe webhook secret is set for site {other['id']}"
    set_secret(db_path, other["id"], "whsec_otherSiteSecret")
    error = a.post(_event(), status=400, site_id=other["id"])["error"]
    assert error["message"] == "Stripe-Signature does not match this site's webhook secret"
    assert a.post(_event(), status=400, site_id="site_unknown")["error"]["message"] == (
        "no Stripe webhook secret is set for site site_unknown")
    assert rows(db_path, "SELECT count(*) AS n FROM payments") == [{"n": 0}]


def test_unusable_events_and_bodies_are_400(stripe_site):
    error = stripe_site.post({"id": "evt_1", "type": "charge.succeeded"}, status=400)["error"]
    assert error["message"] == "invalid Stripe event: created must be a unix time in seconds"
    resp = stripe_site.client.post(URL.format(stripe_site.site_id), b"{", expect_errors=True,
                                   headers={"Stripe-Signature": sign(b"{")})
    assert resp.status_int == 400 and resp.json["error"]["message"].startswith("invalid JSON:")
    big = b" " * (1_048_576 + 1)
    resp = stripe_site.client.post(URL.format(stripe_site.site_id), big, expect_errors=True,
                                   headers={"Stripe-Signature": sign(big)})
    assert resp.status_int == 413


def test_unknown_types_are_200_ignored_and_counted_in_logs(stripe_site, caplog, tally):
    plan = FIXTURES["event"]["data"]["object"]  # Stripe's example event: plan.created
    metrics.enable()  # as an app with /metrics on does
    before = metrics.LOCAL.get_sample_value("tally_stripe_events_total",
                                    {"outcome": "ignored", "type": "plan.created"}) or 0
    with caplog.at_level(logging.INFO, logger="tally"):
        for n in range(2):
            data = stripe_site.post(stripe_event("plan.created", plan, created=1, event_id=f"e{n}"))
            assert data == {"ok": True, "data": {"id": f"e{n}", "status": "ignored"}}
    assert "ignored event type plan.created" in caplog.text and "(2 of this type" in caplog.text
    assert tally.stripe_webhook.resource.ignored.counts() == {"plan.created": 2}
    assert metrics.LOCAL.get_sample_value("tally_stripe_events_total",
                                          {"outcome": "ignored", "type": "plan.created"}) == before + 2


# Duplicates and order ----------------------------------------------------------------------

def test_a_redelivered_event_is_200_and_applied_once(stripe_site, db_path):
    obj = subscription("sub_1", "cus_1", [(price("p", 2000), 1)], status="active", start="2026-09-01")
    event = stripe_event("customer.subscription.created", obj, created=unix("2026-09-01"))
    assert stripe_site.post(event)["data"]["status"] == "applied"
    assert stripe_site.post(event)["data"]["status"] == "duplicate"
    assert rows(db_path, "SELECT count(*) AS n FROM subscription_observations") == [{"n": 1}]
    assert rows(db_path, "SELECT event_id FROM stripe_events") == [{"event_id": event["id"]}]


def _status(db_path, payment_id):
    return rows(db_path, "SELECT status FROM payments WHERE payment_id = ?", (payment_id,))[0]["status"]


def test_out_of_order_deliveries_end_as_in_order(stripe_site, db_path, client, site):
    pending = charge("ch_1", 2000, customer="cus_1", created="2026-09-21", status="pending")
    succeeded = charge("ch_1", 2000, customer="cus_1", created="2026-09-21")
    assert stripe_site.send("charge.succeeded", succeeded, "2026-09-21T12:05:00Z") == "applied"
    assert stripe_site.send("charge.pending", pending, "2026-09-21T12:00:00Z") == "applied"
    assert _status(db_path, "ch_1") == "succeeded"

    won = dispute("dp_1", "ch_1", 2000, created="2026-10-01", status="won")
    opened = dispute("dp_1", "ch_1", 2000, created="2026-10-01", status="needs_response")
    stripe_site.send("charge.dispute.closed", won, "2026-10-20")
    stripe_site.send("charge.dispute.created", opened, "2026-10-01")
    assert _status(db_path, "dp_1") == "failed"

    price_a = price("p", 2000)
    deleted = subscription("sub_1", "cus_1", [(price_a, 1)], status="canceled",
                           start="2026-09-21", canceled_at="2026-11-10", ended_at="2026-11-10")
    updated = subscription("sub_1", "cus_1", [(price_a, 1)], status="active", start="2026-09-21")
    stripe_site.send("customer.subscription.deleted", deleted, "2026-11-10")
    stripe_site.send("customer.subscription.created", updated, "2026-09-21")
    assert rows(db_path, "SELECT status FROM subscriptions") == [{"status": "canceled"}]
    mrr = read(client, site, "/api/v1/stats/mrr?at=2026-10-15")["currencies"]["USD"]["mrr"]
    assert mrr == Decimal(20)
    assert read(client, site, "/api/v1/stats/mrr?at=2026-11-10")["currencies"] == {}


def test_a_refund_takes_its_charges_customer_whatever_the_order(stripe_site, db_path):
    stripe_site.send("refund.created", refund("re_1", "ch_1", 500, created="2026-09-22"),
                     "2026-09-22")
    stripe_site.send("charge.succeeded", charge("ch_1", 2000, customer="cus_1",
                                                created="2026-09-21"), "2026-09-21")
    stripe_site.send("refund.updated", refund("re_1", "ch_1", 500, created="2026-09-22"),
                     "2026-09-23")
    assert rows(db_path, "SELECT payment_id, customer_id FROM payments ORDER BY payment_id") == [
        {"payment_id": "ch_1", "customer_id": "cus_1"}, {"payment_id": "re_1", "customer_id": "cus_1"}]


def test_locked_database_is_503_and_the_retry_applies(config, clock, db_path):
    app = create_app(config, db=open_database(replace(config, busy_timeout_ms=100)), clock=clock)
    account = app.directory.create_account("Busy", "free")
    site = app.directory.create_site(account["id"], ["busy.test"])
    set_secret(db_path, site["id"])
    hook = Stripe(webtest.TestApp(app), site["id"])
    blocker = WriteLock(db_path)
    try:
        error = hook.post(_event(), status=503)["error"]
        assert error == {"code": "rate_limited", "message": "the database is busy; retry after 2 seconds"}
    finally:
        blocker.release()
    assert rows(db_path, "SELECT count(*) AS n FROM stripe_events") == [{"n": 0}]
    assert hook.post(_event())["data"]["status"] == "applied"
    app.stop(timeout=5)


# A customer's life ---------------------------------------------------------------------------

def test_a_customers_life(stripe_site, tally, client, site, clock, db_path):
    """Checkout with a visitor id, three monthly invoices, an upgrade, a partial refund, a
    dispute, a cancellation (then the dispute won); every report along the way."""
    site_id = site["site"]["id"]
    tally.start()
    client.post_json("/api/v1/events", {"s": site_id, "e": "pageview", "u": "https://example.com/",
                                        "r": "https://www.google.com/", "ip": "203.0.113.7",
                                        "ua": UA}, headers=bearer(site["key"]), status=204)
    assert tally.flusher.flush_now(timeout=WAIT)
    visitor = str(rows(db_path, "SELECT visitor_id FROM events")[0]["visitor_id"])
    send = stripe_site.send

    basic = price("price_basic", 2000, product="prod_basic")
    pro = price("price_pro", 5000, product="prod_pro")
    session = stripe_object("checkout.session", customer="cus_life", mode="subscription",
                            subscription="sub_life", payment_intent=None,
                            created=unix("2026-09-21T14:20:00Z"),
                            metadata={"tally_visitor_id": visitor, "tally_user_id": "user-life"})
    assert send("checkout.session.completed", session, "2026-09-21T14:20:00Z") == "applied"
    active = subscription("sub_life", "cus_life", [(basic, 1)], status="active",
                          start="2026-09-21T14:20:00Z")
    send("customer.subscription.created", active, "2026-09-21T14:20:00Z")

    fee = stripe_object("balance_transaction", fee=88, currency="usd")
    months = [("2026-09-21", "2026-10-21"), ("2026-10-21", "2026-11-21"), ("2026-11-21", "2026-12-21")]
    for n, (start, end) in enumerate(months, 1):
        paid = f"{start}T14:21:00Z"
        ch = charge(f"ch_{n}", 2000, customer="cus_life", created=paid,
                    balance_transaction=fee if n == 1 else None)
        inv = invoice(f"in_{n}", "sub_life", "cus_life", charge_id=f"ch_{n}", paid=paid,
                      lines=[invoice_line("sub_life", 2000, start=start, end=end, product="prod_basic")])
        # The second month's invoice arrives before its charge: the same end state.
        order = [("invoice.paid", inv), ("charge.succeeded", ch)] if n == 2 else [
            ("charge.succeeded", ch), ("invoice.paid", inv)]
        for event_type, obj in order:
            assert send(event_type, obj, paid) == "applied"

    upgraded = subscription("sub_life", "cus_life", [(pro, 1)], status="active",
                            start="2026-09-21T14:20:00Z")
    send("customer.subscription.updated", upgraded, "2026-12-05T10:00:00Z")
    proration = invoice("in_p", "sub_life", "cus_life", charge_id="ch_p", paid="2026-12-05T10:00:00Z",
                        lines=[invoice_line("sub_life", 1600, start="2026-12-05", end="2026-12-21",
                                            proration=True)])
    send("invoice.paid", proration, "2026-12-05T10:00:00Z")
    send("charge.succeeded", charge("ch_p", 1600, customer="cus_life", created="2026-12-05T10:00:00Z"),
         "2026-12-05T10:00:00Z")
    send("charge.succeeded", charge("ch_4", 5000, customer="cus_life", created="2026-12-21T14:21:00Z"),
         "2026-12-21T14:21:00Z")
    send("invoice.payment_succeeded",
         invoice("in_4", "sub_life", "cus_life", charge_id="ch_4", paid="2026-12-21T14:21:00Z",
                 lines=[invoice_line("sub_life", 5000, start="2026-12-21", end="2027-01-21",
                                     product="prod_pro")]),
         "2026-12-21T14:21:00Z")
    send("refund.created", refund("re_1", "ch_4", 1500, created="2026-12-28"), "2026-12-28")
    send("charge.dispute.created", dispute("dp_1", "ch_3", 2000, created="2027-01-10"), "2027-01-10")
    canceled = subscription("sub_life", "cus_life", [(pro, 1)], status="canceled",
                            start="2026-09-21T14:20:00Z", canceled_at="2027-01-20",
                            ended_at="2027-01-20")
    send("customer.subscription.deleted", canceled, "2027-01-20")
    clock.set(unix("2027-02-01"))

    revenue = read(client, site, "/api/v1/stats/revenue?from=2026-09-01&to=2027-01-31")
    usd = revenue["currencies"]["USD"]
    figures = {k: usd[k] for k in ("gross", "refunds", "chargebacks", "fees", "net",
                                    "net_after_fees", "payments", "customers")}
    assert figures == {"gross": Decimal("126"), "refunds": Decimal("15"),
                       "chargebacks": Decimal("20"), "fees": Decimal("0.88"),
                       "net": Decimal("91"), "net_after_fees": Decimal("90.12"),
                       "payments": 7, "customers": 1}
    assert [row["channel"] for row in usd["by_channel"]] == ["Organic Search"]

    def mrr(day):
        return read(client, site, f"/api/v1/stats/mrr?at={day}")["currencies"].get("USD", {}).get("mrr")

    assert [mrr(day) for day in ("2026-09-20", "2026-09-21", "2026-11-30", "2026-12-04",
                                 "2026-12-05", "2027-01-19", "2027-01-20")] == [
        None, Decimal(20), Decimal(20), Decimal(20), Decimal(50), Decimal(50), None]
    by_plan = read(client, site, "/api/v1/stats/mrr?at=2026-12-25")["currencies"]["USD"]
    assert [(row["plan"], row["mrr"]) for row in by_plan["by_plan"]] == [("prod_pro", Decimal(50))]
    assert [row["channel"] for row in by_plan["by_channel"]] == ["Organic Search"]

    months = read(client, site, "/api/v1/stats/mrr/movements?from=2026-09-01&to=2027-01-31")
    moves = [(m["month"], m["start_mrr"], m["end_mrr"], m["new"], m["expansion"], m["churn"])
             for m in months["currencies"]["USD"]["months"]]
    assert moves == [
        ("2026-09", 0, 20, 20, 0, 0), ("2026-10", 20, 20, 0, 0, 0), ("2026-11", 20, 20, 0, 0, 0),
        ("2026-12", 20, 50, 0, 30, 0), ("2027-01", 50, 0, 0, 0, -50)]

    customer = read(client, site, "/api/v1/customers/cus_life")
    assert (customer["visitor_id"], customer["user_id"], customer["email"]) == (
        visitor, "user-life", "example@example.com")
    assert customer["attribution"]["channel"] == "Organic Search"
    assert customer["attribution"]["referrer"] == "https://www.google.com/"
    assert customer["totals"]["USD"] == {"paid": Decimal("126"), "refunded": Decimal("35"),
                                         "net": Decimal("91"), "payments": 7}
    payment = read(client, site, "/api/v1/payments/ch_2")
    assert payment["subscription"]["id"] == "sub_life" and payment["amount"] == Decimal(20)
    assert payment["subscription"]["current_period_end"] == "2026-11-21T12:00:00Z"
    assert read(client, site, "/api/v1/payments/ch_p")["subscription"] is None

    # The dispute is won: the chargeback stops counting.
    send("charge.dispute.closed", dispute("dp_1", "ch_3", 2000, created="2027-01-10", status="won"),
         "2027-02-20")
    usd = read(client, site, "/api/v1/stats/revenue?from=2026-09-01&to=2027-01-31")["currencies"]["USD"]
    assert (usd["chargebacks"], usd["net"], usd["payments"]) == (Decimal(0), Decimal(111), 6)
    assert read(client, site, "/api/v1/customers/cus_life")["totals"]["USD"]["refunded"] == Decimal(15)


# Through gunicorn ------------------------------------------------------------------------------

@pytest.mark.slow
def test_through_gunicorn_applied_once_and_no_secret_in_any_log(db_path, server_factory):
    account = json.loads(run_cli("account", "create", "--name", "A", "--json", db=db_path).stdout)
    site_id = json.loads(run_cli("site", "create", "--account", account["id"], "--host",
                                 "example.com", "--json", db=db_path).stdout)["id"]
    set_secret(db_path, site_id)
    server = server_factory(db_path, workers=2, env={
        "GUNICORN_CMD_ARGS": "--access-logfile=- --error-logfile=- --log-level=debug",
        "TALLY_LOG_LEVEL": "DEBUG", "TALLY_METRICS_TOKEN": METRICS_TOKEN,
    })
    url = server.url + URL.format(site_id)
    event = _event()
    payload = body(event)
    statuses = []
    for _ in range(3):  # Stripe's retries: one applied, then duplicates, whichever worker
        status, _, answer = http("POST", url, payload, {"Stripe-Signature": sign(payload),
                                                        "Content-Type": "application/json"})
        statuses.append((status, json.loads(answer)["data"]["status"]))
    assert statuses == [(200, "applied"), (200, "duplicate"), (200, "duplicate")]
    ignored = body(stripe_event("plan.created", FIXTURES["event"]["data"]["object"], created=1))
    assert http("POST", url, ignored, {"Stripe-Signature": sign(ignored)})[0] == 200
    status, _, answer = http("POST", url, payload, {"Stripe-Signature": sign(payload, "whsec_x")})
    assert status == 400 and SECRET[6:].encode() not in answer
    assert rows(db_path, "SELECT payment_id, amount FROM payments") == [
        {"payment_id": "ch_1", "amount": "49.99"}]
    scraped = http("GET", server.url + "/metrics", None, bearer(METRICS_TOKEN))[2].decode()
    counts = {(outcome, kind): sample(scraped, "tally_stripe_events_total", outcome=outcome, type=kind)
              for outcome, kind in (("applied", "charge.succeeded"), ("duplicate", "charge.succeeded"),
                                    ("ignored", "plan.created"))}
    assert counts == {("applied", "charge.succeeded"): 1, ("duplicate", "charge.succeeded"): 2,
                      ("ignored", "plan.created"): 1}, scraped
    server.stop()
    log = server.log()
    assert "ignored event type plan.created" in log
    assert f'"POST /api/v1/integrations/stripe/{site_id} HTTP/1.1" 200' in log
    assert SECRET not in log and SECRET[6:] not in log and SECRET[6:20] not in log
