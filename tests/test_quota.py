"""The monthly event quota (issue 5): caps per plan, what counts, months, plan changes,
several workers sharing one count, and `tally usage`."""

from __future__ import annotations

import calendar
import time

import orjson
import pytest
import webtest

from app import create_app
from quota.plans import PLANS
from quota.usage import UtcMonths, month_of, seconds_until_next_month
from tests.conftest import (
    WAIT,
    FakeClock,
    bearer,
    cli_json,
    config_for,
    execute,
    http,
    provision,
    rows,
    run_cli,
    wait_until,
)
from tests.test_http_foundation import assert_envelope

SEPTEMBER = calendar.timegm((2026, 9, 21, 14, 13, 20))  # FakeClock's default start
TO_OCTOBER = calendar.timegm((2026, 10, 1, 0, 0, 0)) - SEPTEMBER
BOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"


class Worker:
    """One Tally app (as one gunicorn worker holds) with a test client. It stores its
    events when the test says (flush()): with the interval's flush a loaded machine could
    commit one at any point of the test, and while its own flush commits a worker keeps
    the count it read before (QuotaGuard.usage)."""

    def __init__(self, db_path: str, clock: FakeClock):
        self.app = create_app(config_for(db_path, flush_interval=3600.0), clock=clock)
        self.client = webtest.TestApp(self.app)

    def send(self, key: str, body: dict):
        return self.client.post("/api/v1/events", orjson.dumps(body), headers=bearer(key),
                                content_type="application/json", expect_errors=True)

    def flush(self) -> None:
        assert self.app.flusher.flush_now(timeout=WAIT)


@pytest.fixture
def worker(db_path, clock):
    w = Worker(db_path, clock)
    yield w
    w.app.stop(timeout=10)


@pytest.fixture
def second_worker(db_path, clock):
    w = Worker(db_path, clock)
    yield w
    w.app.stop(timeout=10)


def make_site(worker: Worker, plan: str = "free", hosts=("example.com",)):
    directory = worker.app.directory
    account = directory.create_account("Acme", plan)
    return account, *site_and_key(worker, account["id"], hosts)


def site_and_key(worker: Worker, account_id: str, hosts=("example.com",)):
    directory = worker.app.directory
    site = directory.create_site(account_id, list(hosts))
    key = directory.create_key(site["id"], ["events"])
    return site["id"], key["key"]


def batch(site_id: str, count: int = 50, name: str = "pageview") -> dict:
    return {"s": site_id, "b": [{"e": name, "u": "https://example.com/"}] * count}


def usage(db_path: str, month: str = "2026-09") -> int:
    (row,) = rows(db_path, "SELECT sum(events) AS n FROM monthly_usage WHERE month = ?", (month,))
    return row["n"] or 0


def seed_usage(db_path: str, account_public_id: str, events: int, month: str = "2026-09") -> None:
    """Counts as other workers' stored traffic would have left them."""
    execute(db_path, "INSERT INTO monthly_usage (account_id, month, events)"
                     " SELECT id, ?, ? FROM accounts WHERE public_id = ?",
            (month, events, account_public_id))


def assert_quota_refusal(resp, retry_after: int) -> None:
    error = assert_envelope(resp, 429, "quota_exceeded")
    assert error["message"] == (
        "monthly event quota exceeded; it resets at the start of next month (UTC)")
    assert resp.headers["Retry-After"] == str(retry_after)


def test_month_helpers():
    assert month_of(SEPTEMBER) == "2026-09"
    assert seconds_until_next_month(SEPTEMBER) == TO_OCTOBER
    december = calendar.timegm((2026, 12, 31, 23, 59, 0))
    assert month_of(december) == "2026-12" and seconds_until_next_month(december) == 60
    assert seconds_until_next_month(december + 59.5) == 1
    assert month_of(december + 60) == "2027-01"


def test_free_plan_accepts_11000_then_429(worker, clock, db_path):
    _, site_id, key = make_site(worker, "free")
    for i in range(220):
        assert worker.send(key, batch(site_id)).status_int == 204
        if i % 50 == 49:
            worker.flush()
    # Refused while 11,000 are still partly in this worker's memory ...
    assert_quota_refusal(worker.send(key, batch(site_id, 1)), TO_OCTOBER)
    worker.flush()
    assert usage(db_path) == 11_000
    # ... and after they are stored, and later in the month, and for any kind of event.
    clock.advance(3600.5)
    assert_quota_refusal(worker.send(key, batch(site_id, 1)), TO_OCTOBER - 3600)
    identify = {"s": site_id, "e": "$identify", "uid": "user-1", "u": "https://example.com/"}
    assert_quota_refusal(worker.send(key, identify), TO_OCTOBER - 3600)
    worker.flush()
    assert usage(db_path) == 11_000


def test_a_batch_started_under_the_cap_is_accepted_whole(worker, db_path):
    account, site_id, key = make_site(worker, "free")
    seed_usage(db_path, account["id"], 10_999)
    assert worker.send(key, batch(site_id, 50)).status_int == 204
    assert_quota_refusal(worker.send(key, batch(site_id, 1)), TO_OCTOBER)
    worker.flush()
    assert usage(db_path) == 11_049


@pytest.mark.parametrize("plan", ["starter", "growth", "scale"])
def test_paid_plans_accept_up_to_twice_the_allowance(worker, db_path, plan):
    account, site_id, key = make_site(worker, plan)
    allowance = PLANS[plan].allowance
    seed_usage(db_path, account["id"], allowance + 1)  # past the allowance: still accepted
    assert worker.send(key, batch(site_id, 50)).status_int == 204
    worker.flush()
    execute(db_path, "UPDATE monthly_usage SET events = ?", (2 * allowance - 1,))
    worker.app.clock.advance(1.01)  # the shared count is re-read at most once a second
    assert worker.send(key, batch(site_id, 2)).status_int == 204
    assert_quota_refusal(worker.send(key, batch(site_id, 1)), TO_OCTOBER - 1)
    worker.flush()
    assert usage(db_path) == 2 * allowance + 1


def test_identify_and_bots_are_not_counted(worker, db_path):
    account, site_id, key = make_site(worker, "free")
    seed_usage(db_path, account["id"], 10_990)
    for _ in range(3):
        identify = {"s": site_id, "b": [{"e": "$identify", "uid": "u1", "u": "https://example.com/"}] * 50}
        assert worker.send(key, identify).status_int == 204
    bots = {"s": site_id, "b": [{"e": "pageview", "u": "https://example.com/", "ua": BOT}] * 50}
    for _ in range(3):
        assert worker.send(key, bots).status_int == 204
    worker.flush()
    assert usage(db_path) == 10_990
    assert rows(db_path, "SELECT name, count(*) AS n FROM events GROUP BY name") == [
        {"name": "$identify", "n": 150}]
    assert worker.send(key, batch(site_id, 10)).status_int == 204
    assert_quota_refusal(worker.send(key, batch(site_id, 1)), TO_OCTOBER)


def test_two_sites_of_one_account_share_the_count(worker, db_path):
    account, site_a, key_a = make_site(worker, "free")
    site_b, key_b = site_and_key(worker, account["id"], ["shop.example.com"])
    other_account, site_c, key_c = make_site(worker, "free", ["other.test"])
    seed_usage(db_path, account["id"], 10_900)
    assert worker.send(key_a, batch(site_a, 50)).status_int == 204
    body_b = {"s": site_b, "b": [{"e": "buy", "u": "https://shop.example.com/"}] * 50}
    assert worker.send(key_b, body_b).status_int == 204
    assert_quota_refusal(worker.send(key_a, batch(site_a, 1)), TO_OCTOBER)
    assert_quota_refusal(worker.send(key_b, body_b), TO_OCTOBER)
    body_c = {"s": site_c, "b": [{"e": "x", "u": "https://other.test/"}]}
    assert worker.send(key_c, body_c).status_int == 204  # another account: its own count
    worker.flush()
    assert rows(
        db_path,
        "SELECT a.public_id, u.events FROM monthly_usage u JOIN accounts a ON a.id = u.account_id"
        " ORDER BY u.events") == [{"public_id": other_account["id"], "events": 1},
                                  {"public_id": account["id"], "events": 11_000}]


def test_count_starts_again_on_the_first_of_the_month(worker, clock, db_path):
    account, site_id, key = make_site(worker, "free")
    seed_usage(db_path, account["id"], 11_000)
    clock.set(calendar.timegm((2026, 9, 30, 23, 59, 59)) + 0.25)
    assert_quota_refusal(worker.send(key, batch(site_id, 1)), 1)
    clock.set(calendar.timegm((2026, 10, 1, 0, 0, 0)))
    assert worker.send(key, batch(site_id, 50)).status_int == 204
    worker.flush()
    assert usage(db_path, "2026-09") == 11_000 and usage(db_path, "2026-10") == 50
    out = cli_json("usage", account["id"], "--month", "2026-10", db=db_path)
    assert out["events"] == 50


def test_upgrade_lifts_the_block_within_a_second(worker, clock, db_path):
    account, site_id, key = make_site(worker, "free")
    seed_usage(db_path, account["id"], 11_000)
    assert_quota_refusal(worker.send(key, batch(site_id, 1)), TO_OCTOBER)
    run_cli("account", "set-plan", account["id"], "starter", db=db_path)
    clock.advance(1.01)
    assert worker.send(key, batch(site_id, 50)).status_int == 204
    run_cli("account", "set-plan", account["id"], "free", db=db_path)
    clock.advance(1.01)
    assert_quota_refusal(worker.send(key, batch(site_id, 1)), TO_OCTOBER - 2)


def test_a_worker_learns_another_workers_count_within_a_second(worker, second_worker, clock,
                                                               db_path):
    _, site_id, key = make_site(worker, "free")
    assert second_worker.send(key, batch(site_id, 50)).status_int == 204  # reads the count: 0
    for i in range(219):
        assert worker.send(key, batch(site_id, 50)).status_int == 204
        if i % 50 == 49:
            worker.flush()
    worker.flush()  # 10,950 stored by the first worker
    # Until its cached count is a second old, the second worker sees only its own 50 ...
    assert second_worker.send(key, batch(site_id, 50)).status_int == 204
    clock.advance(1.01)
    # ... then the table's 10,950 plus its 100 unstored events: at the cap.
    assert_quota_refusal(second_worker.send(key, batch(site_id, 1)), TO_OCTOBER - 1)
    second_worker.flush()
    assert usage(db_path) == 11_050
    assert_quota_refusal(worker.send(key, batch(site_id, 1)), TO_OCTOBER - 1)


def test_usage_command(worker, db_path):
    account, site_id, key = make_site(worker, "growth")
    for _ in range(3):
        worker.send(key, batch(site_id, 40))
    worker.send(key, {"s": site_id, "e": "$identify", "uid": "u", "u": "https://example.com/"})
    worker.flush()
    out = cli_json("usage", account["id"], "--month", "2026-09", db=db_path)
    assert out == {"account": account["id"], "plan": "growth", "month": "2026-09", "events": 120,
                   "allowance": 1_000_000, "cap": 2_000_000}
    assert cli_json("usage", account["id"], "--month", "2026-08", db=db_path)["events"] == 0
    current = cli_json("usage", account["id"], db=db_path)
    assert current["month"] == time.strftime("%Y-%m", time.gmtime())
    human = run_cli("usage", account["id"], "--month", "2026-09", db=db_path).stdout
    assert "growth" in human and "120" in human and "2000000" in human
    for args in (["usage", "acct_nope"], ["usage", account["id"], "--month", "2026-13"],
                 ["usage", account["id"], "--month", "Sept"]):
        proc = run_cli(*args, db=db_path, check=False)
        assert proc.returncode != 0 and proc.stdout == "" and proc.stderr.startswith("tally: ")


# A real gunicorn with three workers ----------------------------------------------------


@pytest.mark.slow
def test_every_worker_refuses_within_the_bound(db_path, server_factory):
    account, site, key = provision(db_path, name="Busy", host="example.com")
    flush_interval = 0.2
    server = server_factory(db_path, workers=3, env={"TALLY_FLUSH_INTERVAL": str(flush_interval)})
    url = server.url + "/api/v1/events"
    headers = {**bearer(key["key"]), "Content-Type": "application/json"}
    body = orjson.dumps(batch(site["id"], 50))
    accepted = 0
    # Workers learn each other's counts within a flush interval plus a second, so the
    # first refusal may come that much traffic after the cap.
    for _ in range(4_000):
        status, response_headers, payload = http("POST", url, body, headers)
        if status == 429:
            break
        assert status == 204
        accepted += 50
    else:
        pytest.fail("never refused")
    assert accepted >= 11_000
    # Each worker stores what it took within a flush interval (on a busy machine, later:
    # waited for), and re-reads the shared count within a second of that (README's bound).
    month = month_of(time.time())
    assert wait_until(lambda: usage(db_path, month) == accepted), usage(db_path, month)
    time.sleep(1.0 + 0.3)  # the cache's TTL, the documented bound, plus scheduling slack
    for _ in range(30):  # new connections, spread over the three workers
        status, response_headers, payload = http("POST", url, body, headers)
        assert status == 429
        assert orjson.loads(payload)["error"]["code"] == "quota_exceeded"
        assert 0 < int(response_headers["Retry-After"]) <= 31 * 86_400
    assert server.stop() == 0
    assert usage(db_path, month_of(time.time())) == accepted  # stored count == acknowledged
    assert rows(db_path, "SELECT count(*) AS n FROM events") == [{"n": accepted}]


def test_cached_month_follows_the_clock_both_ways():
    months = UtcMonths()
    october = calendar.timegm((2026, 10, 1, 0, 0, 0))
    assert [months.name(t) for t in (SEPTEMBER, october - 0.001, october, SEPTEMBER)] == [
        "2026-09", "2026-09", "2026-10", "2026-09"]
