"""The dashboard through the real app (webtest): users, sign-in, sessions, CSRF, throttling,
access across two accounts, shared links, settings forms, headers, and the figures it
shows against the Stats API's."""

from __future__ import annotations

import hashlib
import re
from decimal import Decimal

import orjson
import pytest
import webtest

from app import create_app
from dashboard.routes import PAGE_ROUTES
from dashboard.web import (
    FAILED_LOGIN_ADDRESS_LIMIT,
    FAILED_LOGIN_LIMIT,
    SESSION_SECONDS,
)
from tests import dashboard_seed as seed
from tests.conftest import FakeClock, bearer, cli_json, config_for, copy_database, rows, run_cli


@pytest.fixture(scope="module")
def world_db(tmp_path_factory):
    """Users, sites and traffic, made once for the module; each test copies the file."""
    db = str(tmp_path_factory.mktemp("dash") / "seed.db")
    return (db, *seed.world(db))


@pytest.fixture
def world(world_db, db_path):
    """The module's world in the test's own database, on either backend."""
    source, world, now = world_db
    db = copy_database(source, db_path)
    clock = FakeClock(now)
    tally = create_app(config_for(db), clock=clock)
    yield {**world, "db": db, "clock": clock, "tally": tally,
           "client": webtest.TestApp(tally)}
    tally.stop(timeout=5)


def sign_in(client, email, password=seed.PASSWORD, ip="192.0.2.10", status=303,
            forwarded_for=None):
    page = client.get("/login")
    form = page.forms[0]
    form["email"] = email
    form["password"] = password
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    return form.submit(status=status, extra_environ={"REMOTE_ADDR": ip}, headers=headers)


def csrf_of(page) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)


def metrics(page) -> dict[str, str]:
    return dict(re.findall(r'data-metric="([a-z_]+)" data-value="([^"]*)"', page.text))


# users ------------------------------------------------------------------------------

def test_user_commands(world):
    db = world["db"]
    short = run_cli("user", "create", "--email", "x@example.com", "--account",
                    world["a"]["account"], "--password-stdin", db=db, check=False,
                    input_text="123456789\n")
    assert short.returncode == 1 and "at least 10 characters" in short.stderr
    listed = cli_json("user", "list", db=db)["users"]
    assert [(u["email"], u["accounts"]) for u in listed] == [
        ("owner-a@example.com", [world["a"]["account"]]),
        ("owner-b@example.com", [world["b"]["account"]])]
    stored = rows(db, "SELECT password_hash FROM users")
    assert all(r["password_hash"].startswith("$argon2id$v=19$m=19456,t=2,p=1$") for r in stored)
    assert seed.PASSWORD not in orjson.dumps(stored).decode()

    sign_in(world["client"], "owner-a@example.com")
    assert world["client"].get("/").status_int == 200
    changed = run_cli("--json", "user", "set-password", "owner-a@example.com",
                      "--password-stdin", db=db, input_text="another long password\n")
    assert orjson.loads(changed.stdout)["sessions_ended"] == 1
    assert world["client"].get("/", status=303).location.startswith("/login")
    sign_in(world["client"], "owner-a@example.com", status=401)
    sign_in(world["client"], "owner-a@example.com", "another long password")

    deleted = cli_json("user", "delete", "owner-a@example.com", db=db)
    assert deleted["deleted"] is True
    assert world["client"].get("/", status=303).location.startswith("/login")
    assert rows(db, "SELECT count(*) AS n FROM user_sessions") == [{"n": 0}]
    again = run_cli("user", "delete", "owner-a@example.com", db=db, check=False)
    assert again.returncode == 1 and "no user" in again.stderr


# sign-in ----------------------------------------------------------------------------

def test_the_login_form_and_a_hashed_expiring_session(world):
    client = world["client"]
    page = client.get("/login")
    names = {field for form in page.forms.values() for field in form.fields}
    assert {"email", "password", "csrf"} <= names
    resp = sign_in(client, "Owner-A@Example.com")
    assert resp.location == "/"
    cookie = next(c for c in resp.headers.getall("Set-Cookie") if c.startswith("tally_session="))
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" not in cookie
    assert f"Max-Age={SESSION_SECONDS}" in cookie
    token = cookie.split(";")[0].split("=", 1)[1]
    assert len(token) >= 43
    stored = rows(world["db"], "SELECT id_hash, expires_at, created_at FROM user_sessions")
    assert stored[0]["id_hash"] == hashlib.sha256(token.encode()).digest()
    assert stored[0]["expires_at"] - stored[0]["created_at"] == SESSION_SECONDS * 1000
    assert client.get("/").status_int == 200
    world["clock"].advance(SESSION_SECONDS + 1)
    assert client.get("/", status=303).location == "/login?next=%2F"


def test_cookies_are_secure_when_the_public_url_is_https(world):
    tally = create_app(config_for(world["db"], public_url="https://tally.example.com"),
                       clock=world["clock"])
    client = webtest.TestApp(tally, extra_environ={"wsgi.url_scheme": "https",
                                                   "HTTP_HOST": "tally.example.com"})
    login_cookie = client.get("/login").headers["Set-Cookie"]
    assert "Secure" in login_cookie
    resp = sign_in(client, "owner-a@example.com")
    session = next(c for c in resp.headers.getall("Set-Cookie") if c.startswith("tally_session"))
    assert "Secure" in session and "HttpOnly" in session
    tally.stop(timeout=5)


def test_wrong_password_and_unknown_email_answer_alike(world):
    wrong = sign_in(world["client"], "owner-a@example.com", "not the password", status=401)
    unknown = sign_in(world["client"], "nobody@example.com", "not the password", status=401)
    assert "Wrong email or password." in wrong.text and "Wrong email or password." in unknown.text
    assert "tally_session=" not in " ".join(wrong.headers.getall("Set-Cookie"))


def test_next_leads_only_back_into_the_site(world):
    client = world["client"]
    site = world["a"]["site"]
    resp = client.get(f"/sites/{site}?period=7d", status=303)
    assert resp.location == f"/login?next=%2Fsites%2F{site}%3Fperiod%3D7d"
    page = client.get(resp.location)
    form = page.forms[0]
    form["email"], form["password"] = "owner-a@example.com", seed.PASSWORD
    assert form.submit(status=303).location == f"/sites/{site}?period=7d"
    client.reset()
    page = client.get("/login?next=//evil.example/")
    form = page.forms[0]
    form["email"], form["password"] = "owner-a@example.com", seed.PASSWORD
    assert form.submit(status=303).location == "/"


def test_logout_ends_the_session(world):
    client = world["client"]
    sign_in(client, "owner-a@example.com")
    home = client.get("/")
    client.post("/logout", {"csrf": "wrong"}, status=403)
    assert client.get("/").status_int == 200
    assert client.post("/logout", {"csrf": csrf_of(home)}, status=303).location == "/login"
    assert rows(world["db"], "SELECT count(*) AS n FROM user_sessions") == [{"n": 0}]
    assert client.get("/", status=303).location.startswith("/login")


POSTS = [(path, suffix) for method, path, suffix in PAGE_ROUTES if method == "POST"]
# Everything a form could change, summed: a refused post leaves it as it was.
STATE = ("SELECT (SELECT count(*) FROM api_keys WHERE revoked_at IS NULL)"
         " + (SELECT count(*) FROM site_hosts) + (SELECT count(*) FROM user_sessions)"
         " + (SELECT count(*) FROM sites) + (SELECT count(*) FROM user_accounts)"
         " + (SELECT count(*) FROM users) + (SELECT count(*) FROM shared_links"
         " WHERE revoked_at IS NULL) + (SELECT count(*) FROM invitations WHERE revoked_at IS NULL"
         " AND used_at IS NULL) AS n")


def concrete_path(path: str, world: dict, site: str, key: str = "key_none") -> str:
    """A route's path with its placeholders filled: the given site, world A's account."""
    for name, value in (("{site_id}", site), ("{key_id}", key), ("{account_id}", world["a"]["account"]),
                        ("{link_id}", "share_none"), ("{invitation_id}", "inv_none"),
                        ("{user_id}", "user_none"), ("{token}", "x" * 43)):
        path = path.replace(name, value)
    return path


@pytest.mark.parametrize("path, suffix", POSTS, ids=[s for _, s in POSTS])
def test_every_form_post_refuses_a_missing_or_wrong_csrf_token(world, path, suffix):
    client = world["client"]
    if suffix != "login":
        sign_in(client, "owner-a@example.com")
    keys = world["tally"].directory.list_keys(world["a"]["site"])
    concrete = concrete_path(path, world, world["a"]["site"], keys[0]["id"])
    body = {"email": "owner-a@example.com", "password": seed.PASSWORD, "host": "new.test",
            "scope": "read", "role": "viewer", "confirm": world["a"]["host"], "revenue": "1"}
    before = rows(world["db"], STATE)
    for csrf in (None, "", "x" * 43):
        data = body if csrf is None else {**body, "csrf": csrf}
        resp = client.post(concrete, data, status=403)
        assert "security token" in resp.text
    assert rows(world["db"], STATE) == before


def test_ten_failures_for_an_email_from_one_address_refuse_that_address_only(world):
    client = world["client"]
    for _ in range(FAILED_LOGIN_LIMIT):
        sign_in(client, "owner-a@example.com", "wrong password", ip="198.51.100.7", status=401)
    refused = sign_in(client, "owner-a@example.com", ip="198.51.100.7", status=429)
    assert "Too many failed sign-ins" in refused.text and "Try again in 15 minutes" in refused.text
    assert refused.headers["Retry-After"] == "900"
    # The owner, at another address, is not locked out by that one; nor is another user.
    client.reset()
    sign_in(client, "owner-a@example.com", ip="198.51.100.8")
    client.reset()
    sign_in(client, "owner-b@example.com", ip="198.51.100.7")
    world["clock"].advance(15 * 60 + 1)
    client.reset()
    sign_in(client, "owner-a@example.com", ip="198.51.100.7")


def test_failures_from_one_address_for_many_emails_refuse_it_for_a_while(world):
    client = world["client"]
    for n in range(FAILED_LOGIN_ADDRESS_LIMIT):
        sign_in(client, f"guess{n}@example.com", "wrong password", ip="198.51.100.7", status=401)
    refused = sign_in(client, "owner-a@example.com", ip="198.51.100.7", status=429)
    assert "Too many failed sign-ins" in refused.text
    sign_in(client, "owner-a@example.com", ip="198.51.100.8")


def test_behind_a_trusted_proxy_the_forwarded_address_is_throttled(world):
    client = world["client"]
    for _ in range(FAILED_LOGIN_LIMIT):
        sign_in(client, "owner-a@example.com", "wrong password", ip="127.0.0.1",
                forwarded_for="198.51.100.7", status=401)
    sign_in(client, "owner-a@example.com", ip="127.0.0.1", forwarded_for="198.51.100.7",
            status=429)
    # The proxy's other clients are not refused; an untrusted peer's header is not believed.
    sign_in(client, "owner-a@example.com", ip="127.0.0.1", forwarded_for="198.51.100.8")
    client.reset()
    sign_in(client, "owner-a@example.com", ip="203.0.113.9", forwarded_for="198.51.100.7")


# access across two accounts ---------------------------------------------------------

def test_a_user_sees_only_the_sites_of_their_accounts(world):
    client = world["client"]
    a, b = world["a"], world["b"]
    sign_in(client, "owner-a@example.com")
    home = client.get("/")
    assert a["site"] in home.text and b["site"] not in home.text
    assert a["host"] in home.text and b["host"] not in home.text
    csrf = csrf_of(home)
    b_key = cli_json("key", "list", "--site", b["site"], db=world["db"])["keys"][0]["id"]
    a_key = cli_json("key", "list", "--site", a["site"], db=world["db"])["keys"][0]["id"]
    for method, path, _ in PAGE_ROUTES:
        if "{site_id}" not in path:
            continue
        for key in (b_key, a_key):
            concrete = concrete_path(path, world, b["site"], key)
            if method == "GET":
                resp = client.get(concrete, status=404)
            else:
                resp = client.post(concrete, {"csrf": csrf, "host": "x.test", "scope": "read",
                                              "confirm": b["host"], "role": "viewer"},
                                   status=404)
            assert b["host"] not in resp.text and b["site"] not in resp.text.replace(concrete, "")
    # A's own key id under A's site works; under B's site (above) it did not.
    assert rows(world["db"], "SELECT count(*) AS n FROM api_keys WHERE revoked_at IS NOT NULL") \
        == [{"n": 0}]
    assert rows(world["db"], "SELECT count(*) AS n FROM site_hosts") == [{"n": 2}]
    # A key revoke under A's site for B's key id is refused too.
    client.post(f"/sites/{a['site']}/settings/keys/{b_key}/revoke", {"csrf": csrf}, status=404)
    # Nothing about site B reaches a user without a session, either.
    client.reset()
    assert client.get(f"/sites/{b['site']}", status=303).location.startswith("/login")
    client.get(f"/sites/{b['site']}/live", status=404)


# figures ----------------------------------------------------------------------------

def api(world, path: str) -> dict:
    resp = world["client"].get(path, headers=bearer(world["a"]["key"]))
    return orjson.loads(resp.body)["data"]


def test_the_top_figures_are_the_stats_apis(world):
    client = world["client"]
    site = world["a"]["site"]
    sign_in(client, "owner-a@example.com")
    page = client.get(f"/sites/{site}?period=7d")
    shown = metrics(page)
    query = re.search(r'id="from" name="from" type="date" value="([^"]+)"', page.text).group(1)
    to = re.search(r'id="to" name="to" type="date" value="([^"]+)"', page.text).group(1)
    aggregate = api(world, f"/api/v1/stats/aggregate?from={query}&to={to}")
    revenue = api(world, f"/api/v1/stats/revenue?from={query}&to={to}")["currencies"]["EUR"]
    mrr = api(world, f"/api/v1/stats/mrr?at={to}")["currencies"]["EUR"]
    assert aggregate["visitors"] == 6 and revenue["net"] == 167
    assert int(shown["visitors"]) == aggregate["visitors"]
    assert int(shown["pageviews"]) == aggregate["pageviews"]
    assert float(shown["bounce_rate"]) == aggregate["bounce_rate"]
    assert float(shown["visit_duration"]) == aggregate["avg_session_seconds"]
    assert Decimal(shown["revenue"]) == Decimal(str(revenue["net"]))
    assert Decimal(shown["mrr"]) == Decimal(str(mrr["mrr"]))
    assert Decimal(shown["revenue_per_visitor"]) == (
        Decimal(str(revenue["net"])) / aggregate["visitors"]).quantize(Decimal("0.01"))
    assert "conversion_rate" not in shown
    # The channel table: visitors from the breakdown, revenue from first touch.
    breakdown = api(world, f"/api/v1/stats/breakdown?by=channel&from={query}&to={to}")["rows"]
    for row in breakdown:
        assert re.search(rf'data-channel="{re.escape(row["value"])}"', page.text)
    organic = re.search(r'data-channel="Organic Search">(.*?)</tr>', page.text, re.S).group(1)
    assert "€49.00" in organic
    campaigns = page.html.select_one("#t-campaign")
    if campaigns is None:  # reports without revenue by=campaign: said at the foot of the page
        assert "campaigns table" in page.html.select_one("aside.note").text
    else:
        row = campaigns.find_parent("section").select_one("tbody tr")
        assert [cell.text.strip() for cell in row.select("th, td")] == ["autumn", "1", "€99.00",
                                                                         "1"]


def test_every_period_and_a_custom_range(world):
    client = world["client"]
    site = world["a"]["site"]
    sign_in(client, "owner-a@example.com")
    for period in ("today", "7d", "30d", "month", "lastmonth", "12mo"):
        page = client.get(f"/sites/{site}?period={period}")
        assert 'aria-current="true">' in page.text
        assert set(metrics(page)) >= {"visitors", "pageviews", "bounce_rate", "visit_duration",
                                      "revenue", "revenue_per_visitor", "mrr"}
    page = client.get(f"/sites/{site}?period=custom&from=2026-09-01&to=2026-09-30")
    assert "1 Sep 2026 – 30 Sep 2026" in page.text
    bad = client.get(f"/sites/{site}?period=custom&from=2026-09-30&to=2026-09-01", status=400)
    assert "is after" in bad.text
    assert client.get(f"/sites/{site}?period=fortnight", status=400)


def test_rows_link_to_the_page_filtered_by_them(world):
    client = world["client"]
    site = world["a"]["site"]
    sign_in(client, "owner-a@example.com")
    page = client.get(f"/sites/{site}?period=7d")
    link = page.html.select_one('tr[data-channel="Organic Search"] a')
    assert link["href"] == f"/sites/{site}?period=7d&filters=channel%3D%3DOrganic+Search"
    filtered = client.get(link["href"])
    assert "Filtered by" in filtered.text and "Organic Search" in filtered.text
    if "filters= on the aggregate report" in filtered.text:
        pytest.skip("the reports take no filters= yet")
    aggregate = api(world, "/api/v1/stats/aggregate?filters=channel%3D%3DOrganic+Search"
                    f"&from={filtered.html.select_one('#from')['value']}"
                    f"&to={filtered.html.select_one('#to')['value']}")
    assert int(metrics(filtered)["visitors"]) == aggregate["visitors"] == 2
    mrr = api(world, "/api/v1/stats/mrr?filters=channel%3D%3DOrganic+Search"
              f"&at={filtered.html.select_one('#to')['value']}")
    assert Decimal(metrics(filtered)["mrr"]) == Decimal(str(mrr["currencies"]["EUR"]["mrr"])) == 49


def test_a_goal_adds_the_conversion_rate(world):
    client = world["client"]
    site = world["a"]["site"]
    sign_in(client, "owner-a@example.com")
    page = client.get(f"/sites/{site}?period=7d")
    link = page.html.select_one("#t-goals").find_parent("section").select_one("tbody a")
    assert link.text == "signup" and "goal=signup" in link["href"]
    chosen = client.get(link["href"])
    assert "Goal" in chosen.html.select_one(".filters").text
    if "goal= (conversion rate)" in chosen.text:
        pytest.skip("the reports take no goal= yet")
    start, end = chosen.html.select_one("#from")["value"], chosen.html.select_one("#to")["value"]
    aggregate = api(world, f"/api/v1/stats/aggregate?goal=signup&from={start}&to={end}")
    assert float(metrics(chosen)["conversion_rate"]) == aggregate["conversion_rate"] == 0.5


def test_revenue_by_a_first_touch_dimension(world):
    client = world["client"]
    site = world["a"]["site"]
    sign_in(client, "owner-a@example.com")
    page = client.get(f"/sites/{site}/revenue?by=source")
    if "revenue by any first-touch dimension" in page.text:
        pytest.skip("the revenue report takes no by= yet")
    table = page.html.select_one("#t-rev-by").find_parent("section")
    assert "Revenue by first-touch source" in table.text
    cells = {tr.th.text: [td.text for td in tr.select("td")] for tr in table.select("tbody tr")}
    assert cells["Google"][0] == "€49.00" and cells["newsletter"][0] == "€99.00"
    client.get(f"/sites/{site}/revenue?by=nonsense", status=400)


def test_home_lists_visitors_and_revenue_of_30_days(world):
    client = world["client"]
    sign_in(client, "owner-a@example.com")
    home = client.get("/")
    assert 'data-site-visitors="6"' in home.text and "€167.00" in home.text


def test_the_revenue_page(world):
    client = world["client"]
    site = world["a"]["site"]
    sign_in(client, "owner-a@example.com")
    page = client.get(f"/sites/{site}/revenue")
    shown = metrics(page)
    mrr = api(world, "/api/v1/stats/mrr")["currencies"]["EUR"]
    assert Decimal(shown["mrr"]) == Decimal(str(mrr["mrr"])) == 167
    assert Decimal(shown["arr"]) == Decimal(str(mrr["arr"]))
    assert int(shown["subscriptions"]) == 3 and int(shown["customers"]) == 3
    plans = page.html.select_one("#t-plan").find_parent("section").text
    assert "pro" in plans and "basic" in plans
    assert page.html.select_one("#movements-data") is not None


# shared links -----------------------------------------------------------------------

def test_a_shared_link_is_read_only_revenue_only_when_asked_and_revocable(world):
    db, site = world["db"], world["a"]["site"]
    created = run_cli("--json", "share", "create", "--site", site, db=db)
    url = orjson.loads(created.stdout)
    assert list(url) == ["url"] and re.fullmatch(r"/share/[A-Za-z0-9_-]{32}", url["url"])
    with_revenue = cli_json("share", "create", "--site", site, "--revenue", db=db)["url"]
    token = url["url"].rsplit("/", 1)[1]
    assert rows(db, "SELECT count(*) AS n FROM shared_links WHERE token_hash = ?",
                (hashlib.sha256(token.encode()).digest(),)) == [{"n": 1}]
    client = world["client"]
    page = client.get(url["url"] + "?period=7d")
    shown = metrics(page)
    assert int(shown["visitors"]) == 6
    assert not {"revenue", "revenue_per_visitor", "mrr"} & set(shown)
    assert "€" not in page.text and "/settings" not in page.text and "Sign out" not in page.text
    assert "Shared view" in page.text
    link = page.html.select_one('tr[data-channel="Direct"] a')["href"]
    assert link.startswith(url["url"] + "?")
    client.get(link)
    assert Decimal(metrics(client.get(with_revenue + "?period=7d"))["revenue"]) == 167
    listed = cli_json("share", "list", "--site", site, db=db)["links"]
    assert [link["revenue"] for link in listed] == [False, True]
    assert token not in orjson.dumps(listed).decode()
    cli_json("share", "revoke", url["url"], db=db)
    client.get(url["url"], status=404)
    cli_json("share", "revoke", listed[1]["id"], db=db)
    client.get(with_revenue, status=404)
    client.get("/share/not-a-token", status=404)


# settings ---------------------------------------------------------------------------

def test_settings_create_a_key_shown_once_and_revoke_it(world):
    client = world["client"]
    site = world["a"]["site"]
    sign_in(client, "owner-a@example.com")
    page = client.get(f"/sites/{site}/settings")
    assert f'data-site="{site}"' in page.html.select_one("#snippet").text
    assert page.html.select_one("#script-seen")["data-seen"] == "yes"
    assert "6,000" not in page.text and 'data-usage="' in page.text
    form = page.forms[next(k for k, f in page.forms.items() if f.action.endswith("/keys"))]
    form["scope"] = ["events"]
    for field in form.fields["scope"]:
        field.checked = field._value in ("events", "read")
    created = form.submit(status=201)
    secret = created.html.select_one("#new-key-secret")["value"]
    assert secret.startswith("tly_")
    client.get("/api/v1/key", headers=bearer(secret), status=200)
    again = client.get(f"/sites/{site}/settings")
    assert secret not in again.text
    key_id = client.get("/api/v1/key", headers=bearer(secret)).json["data"]["id"]
    assert sorted(client.get("/api/v1/key", headers=bearer(secret)).json["data"]["scopes"]) \
        == ["events", "read"]
    row = again.html.select_one(f'tr[data-key="{key_id}"]')
    assert row["data-revoked"] == "no"
    revoke = next(f for f in again.forms.values() if f.action.endswith(f"/{key_id}/revoke"))
    assert revoke.submit(status=303).location.endswith("/settings#keys")
    assert client.get(f"/sites/{site}/settings").html.select_one(
        f'tr[data-key="{key_id}"]')["data-revoked"] == "yes"
    world["clock"].advance(2)  # past the key cache
    client.get("/api/v1/key", headers=bearer(secret), status=401)


def test_settings_hostnames(world):
    client = world["client"]
    site = world["a"]["site"]
    sign_in(client, "owner-a@example.com")
    csrf = csrf_of(client.get(f"/sites/{site}/settings"))
    client.post(f"/sites/{site}/settings/hosts", {"csrf": csrf, "host": "WWW.Shop.test"},
                status=303)
    bad = client.post(f"/sites/{site}/settings/hosts", {"csrf": csrf, "host": "not a host"},
                      status=400)
    assert "invalid host" in bad.text
    assert cli_json("site", "list", db=world["db"])["sites"][0]["hosts"] == [
        "shop.test", "www.shop.test"]
    client.post(f"/sites/{site}/settings/hosts/remove", {"csrf": csrf, "host": "shop.test"},
                status=303)
    last = client.post(f"/sites/{site}/settings/hosts/remove",
                       {"csrf": csrf, "host": "www.shop.test"}, status=400)
    assert "at least one hostname" in last.text


# headers and static files -----------------------------------------------------------

def test_pages_send_a_strict_csp_and_static_files_are_cached_long(world):
    client = world["client"]
    sign_in(client, "owner-a@example.com")
    page = client.get(f"/sites/{world['a']['site']}")
    csp = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp
    assert page.headers["Cache-Control"] == "no-store"
    assert not re.search(r"<script(?![^>]*\b(src=|type=\"application/json\"))", page.text)
    assert " on" not in " ".join(re.findall(r"<[^>]+ on[a-z]+=", page.text))
    for src in re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text):
        resp = client.get(src)
        assert resp.headers["Cache-Control"] == "public, max-age=31536000, immutable"
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
    client.get("/static/0000/../../app.py", status=404)
    assert client.get("/static/0000/app.css").headers["Cache-Control"] == "no-cache"
