"""No single request may stall, slow or break Tally: bounded parsers, exact money within
input bounds, IPv4-mapped addresses, settings out of range."""

from __future__ import annotations

import decimal
import itertools
import json
from decimal import Decimal
from fractions import Fraction

import orjson
import pytest
from crawlerdetect import CrawlerDetect
from hypothesis import given
from hypothesis import strategies as st

from config import QUEUE_MAX_RANGE, Config, ConfigError
from enrichment import agents as agents_module
from enrichment.agents import AgentParser, BotFilter
from reports.money.amounts import round_money
from reports.money.mrr import YEARLY_FACTORS
from tests.conftest import WAIT, bearer, config_for, rows, run_cli
from tests.test_properties import budget
from validation.event import MAX_BATCH

FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"


def exact(resp) -> dict:
    """The answer's data with every JSON number read as the Decimal it spells."""
    return json.loads(resp.body, parse_float=Decimal, parse_int=Decimal)["data"]


def post_json(client, key, path, body, status=None):
    return client.post(path, orjson.dumps(body), expect_errors=True,
                       headers={**bearer(key), "Content-Type": "application/json"}, status=status)


# Caller text is parsed in bounded time ------------------------------------------------


def test_user_agents_are_analysed_up_to_a_cap_that_is_also_the_cache_key():
    """Item 2: 8,000 bytes of "a" plus a unique suffix cost seconds in the bot filter, and
    the unique suffix missed the cache every time."""
    bots, agents = BotFilter(), AgentParser()
    seen = []
    bots._verdicts.fn = lambda ua, fn=bots._verdicts.fn: seen.append(ua) or fn(ua)
    agents._parsed.fn = lambda ua, fn=agents._parsed.fn: seen.append(ua) or fn(ua)
    for suffix in ("1", "2", "3"):
        ua = "a" * 8_000 + suffix
        assert bots.is_bot(ua) is False
        assert agents.describe(ua) == (None, None, "desktop")
    assert len(seen) == 2  # one bot verdict and one parse for all three
    assert all(len(ua) <= 512 for ua in seen)
    assert bots.is_bot("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)")


_TOKENS = ["Mozilla/5.0", "(compatible;", "Googlebot/2.1;", "+http://www.google.com/bot.html)",
           "curl/8.4.0", "python-requests/2.31", "Chrome/120.0.0.0", "Safari/537.36",
           "HeadlessChrome/120", "AhrefsBot/7.0", "my-crawler", "Yandex", "YandexSearch/1",
           "x_checker", "Firefox/128.0", "Mobile", "facebookexternalhit/1.1", "Slackbot",
           "bingbot/2.0", "site-monitoring", "Google Favicon", "YLT", "b0t", "", "a" * 30,
           "Dalvik/2.1.0", "okhttp/4.9", "Go-http-client/1.1", "spider", "Reader"]


@budget(300)
@given(st.lists(st.sampled_from(_TOKENS), min_size=1, max_size=7), st.sampled_from([" ", "", "; "]))
def test_the_linear_bot_filter_agrees_with_crawlerdetect(tokens, separator):
    ua = separator.join(tokens)
    assert agents_module.looks_automated(ua) == CrawlerDetect().is_crawler(ua)


@budget(300)
@given(st.text(st.characters(codec="utf-8"), max_size=40), st.sampled_from(_TOKENS))
def test_the_bot_filter_agrees_with_crawlerdetect_on_any_text(text, token):
    """RE2 folds case and reads text as UTF-8; re folds as Python does: same verdicts."""
    for ua in (text, token + text, text + token, text.upper() + token.lower()):
        assert agents_module.looks_automated(ua) == CrawlerDetect().is_crawler(ua)


# Money stays exact -------------------------------------------------------------------


def payment(payment_id: str, amount, **extra) -> dict:
    return {"payment_id": payment_id, "customer": {"id": "cus_1"}, "amount": amount,
            "currency": "EUR", "kind": "charge", "paid_at": "2026-09-01T12:00:00Z", **extra}


@pytest.mark.parametrize(("body", "message"), [
    (payment("p1", 1e-60), "amount: must have at most 12 decimal places"),
    (payment("p7", 1e-13), "amount: must have at most 12 decimal places"),
    (payment("p2", 1e61), "amount: must be less than 1000000000000000 (10^15)"),
    (payment("p3", 1e27), "amount: must be less than 1000000000000000 (10^15)"),
    (payment("p4", 10, fee=1e-60), "fee: must have at most 12 decimal places"),
    (payment("p5", 10, subscription={"id": "s", "amount": 1e-60}),
     "subscription.amount: must have at most 12 decimal places"),
    (payment("p6", 10, subscription={"id": "s", "amount": 1e20}),
     "subscription.amount: must be less than 1000000000000000 (10^15)"),
])
def test_amounts_out_of_the_summable_range_are_refused(client, site, body, message):
    """Item 3: these were stored, and every money report covering them answered 500."""
    resp = post_json(client, site["key"], "/api/v1/payments", body)
    assert resp.status_int == 400
    assert resp.json["error"] == {"code": "invalid_input",
                                  "message": f"invalid payment input: {message}"}
    assert client.get("/api/v1/stats/revenue", headers=bearer(site["key"])).status_int == 200


def test_the_largest_and_smallest_accepted_amounts_sum_exactly(client, site, clock):
    for number, amount in enumerate(["999999999999999.9", "0.000000000001", "123456789012.345"]):
        body = orjson.dumps(payment(f"big{number}", 1)).replace(b'"amount":1', b'"amount":' + amount.encode())
        client.post("/api/v1/payments", body, status=200,
                    headers={**bearer(site["key"]), "Content-Type": "application/json"})
    data = exact(client.get("/api/v1/stats/revenue?from=2026-09-01&to=2026-09-01",
                            headers=bearer(site["key"])))
    assert data["currencies"]["EUR"]["gross"] == Decimal("1000123456789012.25")


def test_tally_report_mrr_prints_one_line_not_a_traceback(tally, site, db_path):
    """Item 3: a database holding an amount from before the bounds broke the reports."""
    client_site = site["site"]["id"]
    conn = tally.db.conn()
    site_id = conn.execute("SELECT id FROM sites WHERE public_id = ?", (client_site,)).fetchone()[0]
    conn.execute("INSERT INTO customers (site_id, customer_id, as_of_ms, created_at, updated_at)"
                 " VALUES (?, 'c', 0, 0, 0)", (site_id,))
    for number, amount in enumerate(["0." + "0" * 59 + "1", "1" + "0" * 61]):
        conn.execute(
            "INSERT INTO payments (site_id, payment_id, customer_id, amount, currency, kind, status,"
            " paid_at, paid_at_ms, subscription_id, created_at, updated_at) VALUES"
            " (?, ?, 'c', ?, 'EUR', 'charge', 'succeeded', '2026-09-01T00:00:00Z', ?, 's', 0, 0)",
            (site_id, f"old{number}", amount, 1_788_220_800_000))
    conn.execute(
        "INSERT INTO subscription_observations (site_id, payment_id, subscription_id, customer_id,"
        " effective_at_ms, currency, status, amount, started_at, started_at_ms, received_at)"
        " VALUES (?, 'old0', 's', 'c', ?, 'EUR', 'active', ?, '2026-09-01T00:00:00Z', ?, 0)",
        (site_id, 1_788_220_800_000, "0." + "0" * 59 + "1", 1_788_220_800_000))
    conn.execute(
        "INSERT INTO subscriptions (site_id, subscription_id, customer_id, payment_id,"
        " effective_at_ms, currency, status, amount, started_at, started_at_ms, updated_at)"
        " VALUES (?, 's', 'c', 'old1', ?, 'EUR', 'active', ?, '2026-09-01T00:00:00Z', ?, 0)",
        (site_id, 1_788_220_800_000, "1" + "0" * 61, 1_788_220_800_000))
    for report in ("mrr", "revenue"):
        proc = run_cli("report", report, "--site", client_site, "--from", "2026-08-01",
                       "--to", "2026-09-30", db=db_path, check=False)
        assert "Traceback" not in proc.stderr
        if proc.returncode:
            assert proc.stderr.startswith("tally: ") and proc.stderr.count("\n") == 1


SAFE_DIGITS = st.integers(min_value=1, max_value=10**15 - 1)  # 15 significant digits at most


@st.composite
def money(draw, allow_zero=False):
    """A JSON number text of at most 15 significant digits and 12 places, below 10^15."""
    unscaled = draw(st.integers(min_value=0 if allow_zero else 1, max_value=10**15 - 1))
    places = draw(st.integers(min_value=0, max_value=12))
    value = Decimal(unscaled).scaleb(-places, context=decimal.Context(prec=40))
    return format(value, "f")


payment_specs = st.lists(
    st.fixed_dictionaries({
        "amount": money(),
        "fee": st.none() | money(allow_zero=True),
        "currency": st.sampled_from(["EUR", "JPY", "KWD", "XAU"]),
        "kind": st.sampled_from(["charge", "charge", "refund", "chargeback"]),
        "interval": st.none() | st.sampled_from(sorted(YEARLY_FACTORS)),
        "sub_amount": money(allow_zero=True),
    }),
    min_size=1, max_size=6,
)
_sites = itertools.count()


@pytest.fixture
def money_world(db_path):
    """One app for every example of the test (each adds a site of its own)."""
    import webtest

    from app import create_app
    from tests.conftest import FakeClock

    tally = create_app(config_for(db_path), clock=FakeClock())
    account = tally.directory.create_account("M", "scale")
    yield tally, webtest.TestApp(tally), account["id"]
    tally.stop(timeout=5)


@budget(40)
@given(payment_specs)
def test_accepted_payments_sum_exactly_in_every_money_report(money_world, specs):
    tally, client, account = money_world
    site = tally.directory.create_site(account, [f"m{next(_sites)}.example.com"])
    key = tally.directory.create_key(site["id"], ["payments", "read"])["key"]
    headers = {**bearer(key), "Content-Type": "application/json"}
    gross, refunded, fees, mrr = {}, {}, {}, {}
    for number, spec in enumerate(specs):
        currency = spec["currency"]
        body = {"payment_id": f"p{number}", "customer": {"id": "cus"}, "amount": 0,
                "currency": currency, "kind": spec["kind"], "paid_at": "2026-09-01T12:00:00Z"}
        if spec["fee"] is not None:
            body["fee"] = orjson.Fragment(spec["fee"].encode())
        if spec["interval"] is not None and spec["kind"] == "charge":
            body["subscription"] = {"id": f"s{number}", "interval": spec["interval"],
                                    "amount": orjson.Fragment(spec["sub_amount"].encode())}
            mrr[currency] = mrr.get(currency, Fraction(0)) + (
                Fraction(Decimal(spec["sub_amount"])) * YEARLY_FACTORS[spec["interval"]] / 12)
        body["amount"] = orjson.Fragment(spec["amount"].encode())
        client.post("/api/v1/payments", orjson.dumps(body), headers=headers, status=200)
        amount = Decimal(spec["amount"])
        side = gross if spec["kind"] == "charge" else refunded
        side[currency] = side.get(currency, Decimal(0)) + amount
        fees[currency] = fees.get(currency, Decimal(0)) + Decimal(spec["fee"] or 0)

    # Whatever the thread's default context, no money path may round or trap through it.
    hostile = decimal.Context(prec=3, traps=[decimal.Inexact, decimal.Rounded])
    with decimal.localcontext(hostile):
        get = {path: exact(client.get(path, headers=bearer(key), status=200)) for path in (
            "/api/v1/stats/revenue?from=2026-09-01&to=2026-09-01",
            "/api/v1/stats/mrr?at=2026-09-02",
            "/api/v1/stats/mrr/movements?from=2026-09-01&to=2026-09-30",
            "/api/v1/customers/cus")}
    revenue = get["/api/v1/stats/revenue?from=2026-09-01&to=2026-09-01"]["currencies"]
    totals = get["/api/v1/customers/cus"]["totals"]
    context = decimal.Context(prec=80, traps=[decimal.Inexact])
    for currency in gross.keys() | refunded.keys():
        figures = revenue[currency]
        paid, back = gross.get(currency, Decimal(0)), refunded.get(currency, Decimal(0))
        assert figures["fees"] == round_money(fees[currency], currency)
        assert figures["net"] == round_money(context.subtract(paid, back), currency)
        assert totals[currency]["paid"] == round_money(paid, currency)
        assert totals[currency]["net"] == round_money(
            context.subtract(paid, back), currency)
    at = get["/api/v1/stats/mrr?at=2026-09-02"]["currencies"]
    for currency, value in mrr.items():
        if value:
            assert at[currency]["mrr"] == round_money(value, currency)


# IPv4-mapped IPv6 ------------------------------------------------------------------


def test_an_ipv4_mapped_address_gets_the_country_of_the_ipv4_address(client, tally, site, db_path):
    """Item 5: "::ffff:1.2.3.4" got no country while "1.2.3.4" got AU."""
    for ip in ("::ffff:1.2.3.4", "1.2.3.4", "::FFFF:81.2.69.142"):
        post_json(client, site["key"], "/api/v1/events",
                  {"s": site["site"]["id"], "e": "pageview", "u": "https://example.com/",
                   "ip": ip, "ua": FIREFOX}, status=204)
    assert tally.flusher.flush_now(timeout=WAIT)
    assert [r["country"] for r in rows(db_path, "SELECT country FROM events ORDER BY id")] == [
        "AU", "AU", "GB"]


# Settings out of range --------------------------------------------------------------


@pytest.mark.parametrize(("env", "message"), [
    ({"TALLY_QUEUE_MAX": "10"},
     "TALLY_QUEUE_MAX must be between 50 (the largest batch one request may carry) and"
     " 1000000, not 10"),
    ({"TALLY_QUEUE_MAX": "20000000"}, "TALLY_QUEUE_MAX must be between 50"),
    ({"TALLY_LOG_LEVEL": "chatty"}, "TALLY_LOG_LEVEL must be one of DEBUG, INFO, WARNING"),
    ({"TALLY_FLUSH_INTERVAL": "0"}, "TALLY_FLUSH_INTERVAL must be between 0 and 3600"),
])
def test_settings_out_of_range_are_refused(env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Config.from_env(env)
    assert Config.from_env({"TALLY_QUEUE_MAX": "50"}).queue_max == 50
    assert QUEUE_MAX_RANGE[0] == MAX_BATCH


# What the validators accept, the database accepts ---------------------------------------

_EDGE_TEXT = st.text(alphabet=st.sampled_from(["\x00", "\x01", "\x1f", "\x7f", "a", "Z", "é", "€",
                                               "😀", " ", "%", "\u2028", "\ufeff"]),
                     min_size=1, max_size=40)


def _fitting(text: str, limit: int) -> str:
    data = text.encode()[:limit]
    return data.decode("utf-8", "ignore") or "x"


@pytest.fixture
def storage_world(db_path):
    """One app for every example of the test (each adds ids of its own)."""
    import webtest

    from app import create_app
    from tests.conftest import FakeClock

    db = db_path
    tally = create_app(config_for(db), clock=FakeClock())
    account = tally.directory.create_account("S", "scale")
    site = tally.directory.create_site(account["id"], ["example.com"])
    key = tally.directory.create_key(site["id"], ["events", "payments"])["key"]
    yield tally, webtest.TestApp(tally), site["id"], key, db
    tally.stop(timeout=5)


_payment_ids = itertools.count()


@budget(60)
@given(text=_EDGE_TEXT, longest=st.booleans(), identify=st.booleans())
def test_accepted_events_and_payments_are_stored_as_sent(storage_world, text, longest, identify):
    tally, client, site_id, key, db = storage_world
    headers = {**bearer(key), "Content-Type": "application/json"}
    uid = _fitting("😀" * 32 if longest else text, 128)
    url = "https://example.com/" + (("é" * 1100)[:1013] if longest else text)
    event = {"s": site_id, "e": "$identify" if identify else "pageview", "u": url,
             "r": "https://ref.test/" + text, "t": text * (20 if longest else 1), "l": text,
             "uid": uid, "p": {text: text}, "ip": "203.0.113.9", "ua": text}
    before = rows(db, "SELECT count(*) AS n FROM events")[0]["n"]
    client.post("/api/v1/events", orjson.dumps(event), headers=headers, status=204)

    number = next(_payment_ids)
    customer = {"id": f"c{number}", "email": text + "@x.test", "user_id": uid,
                "name": text[:200], "visitor_id": uid, "metadata": {text: text}}
    payment = {"payment_id": f"p{number}", "customer": customer, "amount": 1.5,
               "currency": "EUR", "kind": "charge", "paid_at": "2026-09-01T12:00:00Z",
               "metadata": {"k": text}, "subscription": {"id": f"s{number}", "plan": text[:200]}}
    client.post("/api/v1/payments", orjson.dumps(payment), headers=headers, status=200)

    assert tally.flusher.flush_now(timeout=WAIT)
    stored = rows(db, "SELECT url, uid, language, props FROM events ORDER BY id DESC LIMIT 1")
    assert rows(db, "SELECT count(*) AS n FROM events")[0]["n"] == before + 1
    assert rows(db, "SELECT count(*) AS n FROM dead_letters")[0]["n"] == 0
    assert stored[0]["url"] == url and stored[0]["uid"] == uid
    assert orjson.loads(stored[0]["props"]) == {text: text}
    if identify:
        assert rows(db, "SELECT uid FROM visitor_identities WHERE uid = ?", (uid,))
    (saved,) = rows(db, "SELECT c.email, c.user_id, c.name FROM customers c"
                        " WHERE c.customer_id = ?", (f"c{number}",))
    assert saved == {"email": (text + "@x.test").lower(), "user_id": uid, "name": text[:200]}


def test_bench_table_shows_slow_clients_and_hostile_inputs():
    from bench import results

    scenarios = {
        "slow_clients": {"status": "ok", "idle_connections": 200, "slow_bodies": 20, "probes": 20,
                         "answered_200": 20, "median_ms": 2.5, "max_ms": 11.0},
        "hostile": {"status": "ok", "worst_ms_per_request": 78.0, "worst": "bot filter",
                    "cases": [{"name": "bot filter, unique ua", "ms_per_call": 6.0,
                               "calls_per_request": 13, "ms_per_request": 78.0,
                               "note": "analyses the first 512 characters"}]},
    }
    table = results.text_table(results.assemble({"cores": 2, "cpu_model": "T"}, {"workers": 2},
                                                scenarios, date="2026-11-26T00:00:00Z"))
    assert "/healthz, 200 idle + 20 slow-body clients held" in table
    assert "20/20 answered 200, slowest 11.0 ms" in table
    assert "6.000 ms CPU per call, 78.00 ms per request (13 calls)" in table
