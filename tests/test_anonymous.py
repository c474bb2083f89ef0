"""What anonymous traffic (POST /api/v1/collect) can do (issue 26): take over no customer's
attribution (verified identity), cost no more than its visit (every event counted, each
visitor's `$identify` bounded a day), drain no keyed traffic's reserve, and be held to a
rate per client address (IPv6 per /64). Each over the real app, on both backends, and
again after a restart on the data it wrote."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import Counter

import orjson
import pytest
import webtest
from tally_client import identity_hash as client_identity_hash

from api.client_ip import address_block
from app import create_app
from attribution.identity import identity_hash
from quota.anonymous import AddressRate, IdentifyBudget
from quota.plans import PLANS
from quota.usage import month_of, seconds_until_next_month
from tests.conftest import (
    FakeClock,
    WriteLock,
    bearer,
    cli_json,
    config_for,
    execute,
    http,
    is_postgres,
    provision,
    rows,
    run_cli,
    wait_until,
)
from tests.test_events_http import FIREFOX
from tests.test_http_foundation import assert_envelope
from tests.test_quota import assert_quota_refusal

ATTACKER = "198.51.100.66"
VICTIM = "203.0.113.42"
ATTACKER_BROWSER = "aa" * 16
VICTIM_BROWSER = "bb" * 16
SAFARI = ("Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 (KHTML, like Gecko)"
          " Version/17.5 Safari/605.1.15")


class Service:
    """One app on the test's database, as a worker holds it, with a client. It stores its
    events when the test says (flush()), not on the interval: a worker keeps the count it
    read while its own flush commits, so an interval flush could move a quota answer."""

    def __init__(self, db_path: str, clock: FakeClock, **settings):
        self.db_path = db_path
        self.clock = clock
        settings.setdefault("flush_interval", 3600.0)
        self.app = create_app(config_for(db_path, **settings), clock=clock)
        self.client = webtest.TestApp(self.app)

    def collect(self, body: dict, peer: str = ATTACKER, ua: str = FIREFOX, headers=None):
        return self.client.post("/api/v1/collect", orjson.dumps(body), content_type="text/plain",
                                headers={"User-Agent": ua, **(headers or {})},
                                extra_environ={"REMOTE_ADDR": peer}, expect_errors=True)

    def events(self, key: str, body: dict):
        return self.client.post("/api/v1/events", orjson.dumps(body), headers=bearer(key),
                                content_type="application/json", expect_errors=True)

    def payment(self, key: str, payment_id: str, customer: dict):
        body = {"payment_id": payment_id, "amount": 49, "currency": "EUR", "kind": "charge",
                "paid_at": "2026-09-21T14:30:00Z", "customer": customer}
        return self.client.post("/api/v1/payments", orjson.dumps(body), headers=bearer(key),
                                content_type="application/json", expect_errors=True)

    def customer(self, key: str, customer_id: str) -> dict:
        resp = self.client.get(f"/api/v1/customers/{customer_id}", headers=bearer(key))
        return resp.json["data"]["attribution"]

    def flush(self) -> None:
        assert self.app.flusher.flush_now(timeout=30)

    def stop(self) -> None:
        self.app.stop(timeout=10)


@pytest.fixture
def service(db_path, clock):
    started = []

    def start(**settings) -> Service:
        one = Service(db_path, clock, **settings)
        started.append(one)
        return one
    yield start
    for one in started:
        one.stop()


def new_site(service: Service, plan: str = "free") -> dict:
    directory = service.app.directory
    account = directory.create_account("Shop", plan)
    site = directory.create_site(account["id"], ["a.test"])
    key = directory.create_key(site["id"], ["events", "payments", "read"])
    return {"account": account["id"], "id": site["id"], "key": key["key"]}


def pageview(site: dict, url: str = "https://a.test/", browser: str | None = None) -> dict:
    return {"s": site["id"], "e": "pageview", "u": url, **({"v": browser} if browser else {})}


def identify(site: dict, uid: str, browser: str | None = None, uh: str | None = None) -> dict:
    body = {"s": site["id"], "e": "$identify", "u": "https://a.test/account", "uid": uid}
    if browser:
        body["v"] = browser
    if uh is not None:
        body["uh"] = uh
    return body


def stored_identifies(db_path: str) -> list[str]:
    return [r["uid"] for r in rows(db_path, "SELECT uid FROM events WHERE name = '$identify'"
                                            " ORDER BY id")]


def month_usage(db_path: str) -> int:
    return sum(r["events"] for r in rows(db_path, "SELECT events FROM monthly_usage"))


def anonymous_usage(db_path: str) -> int:
    return sum(r["anonymous"] for r in rows(db_path, "SELECT anonymous FROM monthly_usage"))


def seed_anonymous(db_path: str, account: str, events: int, anonymous: int) -> None:
    """Counts as earlier traffic of other workers would have left them."""
    execute(db_path, "INSERT INTO monthly_usage (account_id, month, events, anonymous)"
                     " SELECT id, '2026-09', ?, ? FROM accounts WHERE public_id = ?",
            (events, anonymous, account))


# Verified identity (issue 26, part 3) ---------------------------------------------------

def test_an_anonymous_identify_cannot_take_over_a_customers_attribution(service, db_path):
    tally = service()
    site = new_site(tally)
    assert tally.payment(site["key"], "pay_1", {"id": "cust_victim", "user_id": "1042"}
                         ).status_int == 200
    assert tally.customer(site["key"], "cust_victim")["channel"] == "Unattributed"
    # The replay: a pageview from an ad, then the victim's user id, from the browser.
    attack = "https://a.test/?utm_source=attacker&utm_medium=cpc"
    assert tally.collect(pageview(site, attack, ATTACKER_BROWSER)).status_int == 204
    assert tally.collect(identify(site, "1042", ATTACKER_BROWSER)).status_int == 204
    # And a claim on a user id that has no customer yet.
    assert tally.collect(identify(site, "1043", ATTACKER_BROWSER)).status_int == 204
    tally.flush()
    assert tally.customer(site["key"], "cust_victim")["channel"] == "Unattributed"
    # Stored as events (and counted: three anonymous events), linked to no one.
    assert stored_identifies(db_path) == ["1042", "1043"]
    assert rows(db_path, "SELECT count(*) AS n FROM visitor_identities") == [{"n": 0}]
    assert month_usage(db_path) == 3

    # The claim made in advance stays without effect when that customer pays.
    assert tally.payment(site["key"], "pay_2", {"id": "cust_later", "user_id": "1043"}
                         ).status_int == 200
    assert tally.customer(site["key"], "cust_later")["channel"] == "Unattributed"

    # The real user, later, from the site's page with the hash its server computed.
    made = cli_json("site", "identity-secret", "--site", site["id"], db=db_path)
    secret = made["identity_secret"]
    assert made["replaced"] is False and secret.startswith("tis_") and len(secret) == 47
    tally.clock.advance(3600)
    newsletter = "https://a.test/?utm_source=newsletter&utm_medium=email"
    assert tally.collect(pageview(site, newsletter, VICTIM_BROWSER), peer=VICTIM,
                         ua=SAFARI).status_int == 204
    wrong = identify(site, "1042", VICTIM_BROWSER, uh=identity_hash("tis_" + "x" * 43, "1042"))
    assert tally.collect(wrong, peer=VICTIM, ua=SAFARI).status_int == 204  # not an error
    tally.clock.advance(2)  # past the identity-secret cache's second
    signed = identify(site, "1042", VICTIM_BROWSER, uh=client_identity_hash(secret, "1042"))
    assert tally.collect(signed, peer=VICTIM, ua=SAFARI).status_int == 204
    tally.flush()
    victim = tally.customer(site["key"], "cust_victim")
    # The attacker's earlier session would be the first touch if its link counted.
    assert (victim["channel"], victim["source"]) == ("Email", "newsletter")
    linked = rows(db_path, "SELECT uid FROM visitor_identities")
    assert linked == [{"uid": "1042"}]
    # The attacker's old unverified claim still does nothing.
    assert tally.customer(site["key"], "cust_later")["channel"] == "Unattributed"
    tally.stop()

    # A restart on the data these wrote: the same answers, and the secret still verifies.
    again = service()
    assert again.customer(site["key"], "cust_victim")["channel"] == "Email"
    assert again.customer(site["key"], "cust_later")["channel"] == "Unattributed"
    assert again.payment(site["key"], "pay_3", {"id": "cust_3", "user_id": "u-3"}
                         ).status_int == 200
    browser = "cc" * 16
    assert again.collect(pageview(site, newsletter, browser), peer="192.0.2.3").status_int == 204
    assert again.collect(identify(site, "u-3", browser, uh=identity_hash(secret, "u-3")),
                         peer="192.0.2.3").status_int == 204
    again.flush()
    assert again.customer(site["key"], "cust_3")["channel"] == "Email"
    assert cli_json("check", db=db_path)["ok"]


def test_a_server_identify_stays_trusted_and_a_new_secret_retires_the_old(service, db_path):
    tally = service()
    site = new_site(tally)
    first = cli_json("site", "identity-secret", "--site", site["id"], db=db_path)
    second = cli_json("site", "identity-secret", "--site", site["id"], db=db_path)
    assert second["replaced"] is True and second["identity_secret"] != first["identity_secret"]
    human = run_cli("site", "identity-secret", "--site", site["id"], db=db_path).stdout
    assert "shown only once" in human
    third = rows(db_path, "SELECT secret FROM site_identity_secrets")[0]["secret"]
    assert third in human and third != second["identity_secret"]
    missing = run_cli("site", "identity-secret", "--site", "site_nope", db=db_path, check=False)
    assert missing.returncode == 1 and "no site site_nope" in missing.stderr

    tally.clock.advance(2)
    old = identify(site, "u-old", "dd" * 16, uh=identity_hash(first["identity_secret"], "u-old"))
    assert tally.collect(old).status_int == 204
    keyed = {"s": site["id"], "e": "$identify", "u": "https://a.test/", "uid": "u-server",
             "ip": "192.0.2.77", "ua": FIREFOX}
    assert tally.events(site["key"], keyed).status_int == 204
    tally.flush()
    assert [r["uid"] for r in rows(db_path, "SELECT uid FROM visitor_identities")] == ["u-server"]
    # Keyed `$identify` is still free (spec); the anonymous one counted.
    assert month_usage(db_path) == 1


def test_the_identity_hash_field_is_checked_like_the_others(service):
    tally = service()
    site = new_site(tally)
    for body in ({**pageview(site), "uh": "ab" * 32}, identify(site, "u", uh=12),
                 identify(site, "u", uh="a" * 129)):
        error = assert_envelope(tally.collect(body), 400, "invalid_input")
        assert error["message"].startswith("invalid event input: uh: must be a string of at most"
                                           " 128 characters, sent with $identify only")
    # uh is collect's own: the keyed API's contract is unchanged.
    keyed = {**identify(site, "u"), "uh": "ab" * 32, "ip": "192.0.2.1"}
    error = assert_envelope(tally.events(site["key"], keyed), 400, "invalid_input")
    assert error["message"] == "invalid event input: uh: unknown field"


def test_identity_hashes_agree_between_server_client_and_the_standard():
    secret, uid = "tis_" + "k" * 43, "user-ü-1042"
    expected = hmac.new(secret.encode(), uid.encode(), hashlib.sha256).hexdigest()
    assert identity_hash(secret, uid) == client_identity_hash(secret, uid) == expected
    assert client_identity_hash(secret, 1042) == identity_hash(secret, "1042")


# $identify from the browser: counted, bounded per visitor and day ------------------------

def test_browser_identifies_count_and_are_bounded_per_visitor_and_day(service, db_path):
    tally = service(identifies_per_visitor=3)
    site = new_site(tally)
    secret = cli_json("site", "identity-secret", "--site", site["id"], db=db_path)
    secret = secret["identity_secret"]
    browser = "ee" * 16
    sent = ["u1", "u1", "u2", "u3", "u4", "u1"]  # repeats and a fourth user id: dropped
    for uid in sent:
        assert tally.collect(identify(site, uid, browser)).status_int == 204
    # A verified identify of a user id seen unverified passes once: it is the one that links.
    for _ in range(2):
        assert tally.collect(identify(site, "u2", browser, uh=identity_hash(secret, "u2"))
                             ).status_int == 204
    # Another visitor (another browser; or cookieless, another ip + ua) has its own bound.
    assert tally.collect(identify(site, "u4", "ff" * 16)).status_int == 204
    assert tally.collect(identify(site, "u4"), ua=SAFARI).status_int == 204
    assert tally.collect(identify(site, "u4"), ua=SAFARI).status_int == 204
    tally.flush()
    assert stored_identifies(db_path) == ["u1", "u2", "u3", "u2", "u4", "u4"]
    assert month_usage(db_path) == 6
    assert [r["uid"] for r in rows(db_path, "SELECT uid FROM visitor_identities")] == ["u2"]
    # The next UTC day the visitor may identify again.
    tally.clock.advance(86_400)
    assert tally.collect(identify(site, "u1", browser)).status_int == 204
    tally.flush()
    assert stored_identifies(db_path)[-1] == "u1"
    assert cli_json("check", db=db_path)["ok"]
    tally.stop()
    # After a restart the stored counts stand, and `tally check` still matches them.
    again = service()
    assert again.collect(pageview(site)).status_int == 204
    again.flush()
    assert month_usage(db_path) == 8
    assert cli_json("usage", site["account"], "--month", "2026-09", db=db_path)["events"] == 8
    assert cli_json("check", db=db_path)["ok"]
    # Pruned, the counted anonymous identifies are remembered as deleted: the check holds.
    assert cli_json("prune", "--before", "2026-09-23", db=db_path)["events"] == 8
    assert cli_json("check", db=db_path)["ok"]


def test_an_identify_refused_after_its_claim_can_be_sent_again(service, db_path):
    tally = service(queue_max=50)
    site = new_site(tally)
    full = {"s": site["id"], "b": [{"e": "pageview", "u": "https://a.test/"}] * 50}
    blocker = WriteLock(db_path)  # nothing is stored, so the queue stays full
    try:
        assert tally.events(site["key"], full).status_int == 204
        assert_envelope(tally.collect(identify(site, "u1", "ab" * 16)), 503, "rate_limited")
    finally:
        blocker.release()
    tally.flush()
    assert tally.collect(identify(site, "u1", "ab" * 16)).status_int == 204
    assert tally.collect(identify(site, "u1", "ab" * 16)).status_int == 204  # dropped
    tally.flush()
    assert stored_identifies(db_path) == ["u1"]


def test_identify_budget_forgets_the_oldest_visitor_when_full():
    budget = IdentifyBudget(per_visitor=1, max_entries=2)
    assert budget.claim(b"a", 1, "u", False) and budget.claim(b"b", 1, "u", False)
    assert budget.claim(b"a", 1, "u", False) is None
    assert budget.claim(b"c", 1, "u", False)  # b (least recently used) goes
    assert budget.claim(b"b", 1, "u", False)
    undo = budget.claim(b"d", 1, "u", True)
    undo()
    assert budget.claim(b"d", 1, "u", True)


# The reserve kept for keyed traffic (issue 26, part 4) ------------------------------------

def test_an_anonymous_flood_cannot_spend_what_keyed_traffic_needs(service, db_path):
    # No per-address limit here: many addresses could send this flood.
    tally = service(collect_rate=0)
    site = new_site(tally)
    free = PLANS["free"]
    limit = free.anonymous_limit(10)
    assert (limit, free.cap) == (10_000, 11_000)
    seed_anonymous(db_path, site["account"], limit - 40, limit - 40)
    answers = []
    for n in range(1_100):  # a forged visitor id each
        answers.append(tally.collect(pageview(site, browser=f"{n:032x}")).status_int)
    assert answers.count(204) == 40 and answers.count(429) == 1_060
    refused = tally.collect(pageview(site))
    error = assert_envelope(refused, 429, "quota_exceeded")
    assert "anonymous events" in error["message"] and int(refused.headers["Retry-After"]) > 0
    keyed = {"s": site["id"], "e": "Signup", "u": "https://a.test/"}
    assert tally.events(site["key"], keyed).status_int == 204
    tally.flush()
    assert (month_usage(db_path), anonymous_usage(db_path)) == (limit + 1, limit)
    tally.stop()

    # After a restart the stored count keeps anonymous traffic out, keyed traffic in...
    again = service(collect_rate=0)
    assert again.collect(pageview(site)).status_int == 429
    assert again.events(site["key"], keyed).status_int == 204
    # Workers that each saw the count late let anonymous events past their limit (by as
    # much as a flush interval's traffic): those never count against keyed traffic...
    execute(db_path, "UPDATE monthly_usage SET events = ?, anonymous = ?",
            (limit + 3_000, limit + 2_500))
    again.clock.advance(2)
    assert again.events(site["key"], keyed).status_int == 204
    assert again.collect(pageview(site)).status_int == 429
    # ...which gets the spec's answer at the cap.
    execute(db_path, "UPDATE monthly_usage SET events = ?, anonymous = ?",
            (free.cap + 2_500, limit + 2_500))
    again.clock.advance(2)
    wait = seconds_until_next_month(again.clock())
    assert_quota_refusal(again.events(site["key"], keyed), wait)
    assert_quota_refusal(again.collect(pageview(site)), wait)


def test_the_reserve_is_a_setting(service, db_path):
    tally = service(collect_rate=0, keyed_reserve_percent=0)
    site = new_site(tally, "starter")
    seed_anonymous(db_path, site["account"], PLANS["starter"].cap - 1, PLANS["starter"].cap - 1)
    assert tally.collect(pageview(site)).status_int == 204
    assert PLANS["starter"].anonymous_limit(10) == 190_000
    assert PLANS["scale"].anonymous_limit(100) == PLANS["scale"].allowance


# A rate per client address (issue 26, part 4) --------------------------------------------

def test_collect_is_limited_per_address_with_ipv6_per_64(service):
    tally = service(collect_rate=1, collect_burst=3)
    site = new_site(tally)
    for _ in range(3):
        assert tally.collect(pageview(site)).status_int == 204
    refused = tally.collect(pageview(site))
    error = assert_envelope(refused, 429, "too_many_requests")
    assert error["message"] == "too many requests from this address; retry after Retry-After seconds"
    assert refused.headers["Retry-After"] == "1"
    assert refused.headers["Access-Control-Allow-Origin"] == "*"
    assert tally.collect(pageview(site), peer="198.51.100.67").status_int == 204
    # IPv6: one /64 is one client, whichever of its addresses it uses.
    for n in range(3):
        assert tally.collect(pageview(site), peer=f"2001:db8:1:2::{n + 1}").status_int == 204
    assert tally.collect(pageview(site), peer="2001:db8:1:2:ffff::9").status_int == 429
    assert tally.collect(pageview(site), peer="2001:db8:1:3::1").status_int == 204
    # Behind a trusted proxy the forwarded address is the client.
    forwarded = {"X-Forwarded-For": "192.0.2.200"}
    for _ in range(3):
        assert tally.collect(pageview(site), peer="127.0.0.1", headers=forwarded
                             ).status_int == 204
    assert tally.collect(pageview(site), peer="127.0.0.1", headers=forwarded).status_int == 429
    assert tally.collect(pageview(site), peer="127.0.0.1").status_int == 204
    # Tokens come back at the rate; the keyed API has no such limit.
    tally.clock.advance(1)
    assert tally.collect(pageview(site)).status_int == 204
    assert tally.collect(pageview(site)).status_int == 429
    for _ in range(5):
        assert tally.events(site["key"], pageview(site)).status_int == 204


def test_address_blocks_and_the_bucket():
    assert address_block("2001:db8:1:2:aaaa:bbbb:cccc:dddd") == "2001:db8:1:2::/64"
    assert address_block("203.0.113.9") == "203.0.113.9"
    clock = FakeClock()
    rate = AddressRate(2, 2, clock, max_entries=2)
    assert [rate.take("a") for _ in range(3)] == [0, 0, 1]
    clock.advance(0.5)
    assert rate.take("a") == 0 and rate.take("a") == 1
    rate.take("b")
    rate.take("c")  # "a" was least recently used: it goes, and comes back full
    assert rate.take("a") == 0
    assert AddressRate(0, 1, clock).take("a") == 0  # off


def test_settings_from_the_environment():
    from config import Config, ConfigError
    config = Config.from_env({"TALLY_COLLECT_RATE": "2.5", "TALLY_COLLECT_BURST": "20",
                              "TALLY_KEYED_RESERVE": "25"})
    assert (config.collect_rate, config.collect_burst, config.keyed_reserve_percent) == (2.5, 20, 25)
    defaults = Config.from_env({})
    assert (defaults.collect_rate, defaults.collect_burst,
            defaults.keyed_reserve_percent) == (10.0, 200, 10)
    for name, value in (("TALLY_COLLECT_RATE", "-1"), ("TALLY_COLLECT_RATE", "fast"),
                        ("TALLY_COLLECT_BURST", "0"), ("TALLY_KEYED_RESERVE", "101")):
        with pytest.raises(ConfigError, match=name):
            Config.from_env({name: value})


def test_a_restarted_worker_limits_the_same_way(service, db_path):
    settings = {"collect_rate": 1, "collect_burst": 1}
    tally = service(**settings)
    site = new_site(tally)
    assert tally.collect(pageview(site)).status_int == 204
    assert tally.collect(pageview(site)).status_int == 429
    tally.flush()
    tally.stop()
    again = service(**settings)
    assert again.collect(pageview(site)).status_int == 204
    assert again.collect(pageview(site)).status_int == 429
    again.flush()
    assert rows(db_path, "SELECT count(*) AS n FROM events WHERE anonymous = 1") == [{"n": 2}]




# Schema version 16 on a database of version 15 ----------------------------------------

def test_a_version_15_database_gains_the_anonymous_column(service, db_path):
    tally = service()
    site = new_site(tally)
    assert tally.events(site["key"], pageview(site)).status_int == 204
    assert tally.collect(pageview(site)).status_int == 204
    tally.flush()
    tally.stop()
    # Back to what version 15 left: no column (its rows were all keyed or uncounted alike).
    execute(db_path, "DELETE FROM events WHERE anonymous = 1")
    execute(db_path, "UPDATE monthly_usage SET events = 1, anonymous = 0")
    execute(db_path, "ALTER TABLE events DROP COLUMN anonymous")
    execute(db_path, "ALTER TABLE monthly_usage DROP COLUMN anonymous")
    if is_postgres(db_path):
        execute(db_path, "UPDATE tally_schema_version SET version = 15")
    else:
        execute(db_path, "PRAGMA user_version = 15")

    assert cli_json("init", db=db_path)["schema_version"] >= 16
    assert rows(db_path, "SELECT anonymous FROM events") == [{"anonymous": None}]
    assert rows(db_path, "SELECT anonymous FROM monthly_usage") == [{"anonymous": 0}]
    again = service()
    assert again.collect(identify(site, "u1")).status_int == 204
    again.flush()
    assert rows(db_path, "SELECT name, anonymous FROM events ORDER BY id") == [
        {"name": "pageview", "anonymous": None}, {"name": "$identify", "anonymous": 1}]
    assert (month_usage(db_path), anonymous_usage(db_path)) == (2, 1)
    assert cli_json("check", db=db_path)["ok"]


# Under gunicorn: several workers, the real clock ---------------------------------------

@pytest.mark.slow
def test_under_gunicorn_a_flood_stops_and_keyed_traffic_goes_on(db_path, server_factory):
    account, site, key = provision(db_path, name="Flooded", host="a.test")
    site, key = site["id"], key["key"]
    limit = PLANS["free"].anonymous_limit(10)
    month = month_of(time.time())
    execute(db_path, "INSERT INTO monthly_usage (account_id, month, events, anonymous)"
                     " SELECT id, ?, ?, ? FROM accounts WHERE public_id = ?",
            (month, limit - 100, limit - 100, account["id"]))
    env = {"TALLY_FLUSH_INTERVAL": "0.2", "TALLY_COLLECT_BURST": "30",
           "TALLY_COLLECT_RATE": "0.001"}
    server = server_factory(db_path, workers=2, env=env)

    def collect(n: int, forwarded: str | None):
        body = orjson.dumps({"s": site, "e": "pageview", "u": "https://a.test/", "v": f"{n:032x}"})
        headers = {"Content-Type": "text/plain", "User-Agent": FIREFOX}
        if forwarded:
            headers["X-Forwarded-For"] = forwarded
        status, _, payload = http("POST", server.url + "/api/v1/collect", body, headers)
        return f"{status} {orjson.loads(payload)['error']['code']}" if payload else str(status)

    def keyed() -> int:
        body = orjson.dumps({"s": site, "e": "Signup", "u": "https://a.test/"})
        headers = {**bearer(key), "Content-Type": "application/json"}
        return http("POST", server.url + "/api/v1/events", body, headers)[0]

    # One address: at most a burst per worker gets through.
    one = Counter(collect(n, None) for n in range(100))
    assert one["429 too_many_requests"] >= 100 - 2 * 30 and one["204"] >= 30
    # A new address each (behind the trusted loopback proxy): each worker stops once the
    # anonymous limit is reached, counting what it holds, so at most 100 more each.
    spread = Counter(collect(n, f"10.0.{n >> 8}.{n & 255}") for n in range(1000, 1400))
    assert spread["429 quota_exceeded"] >= 400 - 2 * 100
    assert keyed() == 204
    accepted = one["204"] + spread["204"]
    # Every worker re-reads the stored count within a second of its being stored (README's
    # bound): wait until it is stored (a loaded flush thread is late), then the second.
    assert wait_until(lambda: rows(db_path, "SELECT anonymous FROM monthly_usage")[0]
                      == {"anonymous": limit - 100 + accepted})
    time.sleep(1.0 + 0.5)
    assert collect(5000, "10.9.9.9") == "429 quota_exceeded"
    assert keyed() == 204
    assert server.stop() == 0
    stored = rows(db_path, "SELECT events, anonymous FROM monthly_usage")[0]
    assert stored == {"events": limit - 100 + accepted + 2, "anonymous": limit - 100 + accepted}
    assert rows(db_path, "SELECT count(*) AS n FROM events WHERE anonymous = 1") == [
        {"n": accepted}]

    # Restarted on that data: anonymous events still refused, keyed ones still taken.
    again = server_factory(db_path, workers=2, env=env)
    server.url = again.url
    assert collect(6000, "10.9.9.10") == "429 quota_exceeded"
    assert keyed() == 204
