"""Issue 30, parts 1-3, through the real app (webtest) and the real CLI: the first run's
one-time setup link, the install check, sites added and removed, roles, invitations and
shared links on the settings page; and the schema's role column on an older database."""

from __future__ import annotations

import html
import re
import shutil
import sqlite3
from pathlib import Path

import orjson
import pytest
import webtest

from app import create_app
from dashboard.first_run import origin
from dashboard.routes import PAGE_ROUTES
from storage.db import schema
from storage.directory import hash_secret
from storage.maintenance import _SITE_TABLES
from storage.people import People
from tests import dashboard_seed as seed
from tests import test_dashboard
from tests.conftest import (
    WAIT,
    bearer,
    cli_json,
    config_for,
    execute,
    is_postgres,
    rows,
    run_cli,
)
from tests.test_dashboard import concrete_path, csrf_of, sign_in

# The dashboard tests' seeded world (two accounts, a site and an owner each, traffic, money).
world_db = test_dashboard.world_db
world = test_dashboard.world

PASSWORD = "a long enough password"
DASHBOARD_PAGES = {"site", "live", "revenue", "funnels"}


def token_of(url: str, prefix: str) -> str:
    return re.search(prefix + r"/([A-Za-z0-9_-]+)", url).group(1)


def set_up(client, token: str, email="owner@example.com", host="shop.example", status=303,
           password=PASSWORD):
    page = client.get(f"/setup/{token}")
    form = page.forms[0]
    form["email"], form["password"], form["host"] = email, password, host
    return form.submit(status=status)


# first run -------------------------------------------------------------------------------

def test_a_new_install_explains_the_setup_link_which_makes_owner_and_site(tally, client, clock,
                                                                        db_path):
    welcome = client.get("/")
    assert welcome.status_code == 200 and "tally setup-link" in welcome.text
    assert "data-first-run" in welcome.text
    token = People(tally.db, clock).new_setup_token()
    # Only its digest is stored.
    stored = rows(db_path, "SELECT token_hash FROM setup_tokens")
    assert [bytes(r["token_hash"]) for r in stored] == [hash_secret(token)]

    weak = set_up(client, token, status=400, password="short")
    assert "10 characters" in weak.text
    bad_host = client.get(f"/setup/{token}").forms[0]
    bad_host["email"], bad_host["password"], bad_host["host"] = "o@example.com", PASSWORD, "not a host"
    assert "invalid host" in bad_host.submit(status=400).text.lower()
    assert rows(db_path, "SELECT count(*) AS n FROM users") == [{"n": 0}]

    done = set_up(client, token, host="Shop.Example")
    site_id = re.match(r"/sites/(site_[a-z0-9]+)/settings\?welcome=1", done.location).group(1)
    settings = client.get(done.location)
    assert f'data-site="{site_id}"' in html.unescape(settings.text)  # the snippet
    assert "/js/tally.js" in settings.text and 'data-install="waiting"' in settings.text
    assert rows(db_path, "SELECT host FROM site_hosts") == [{"host": "shop.example"}]
    assert rows(db_path, "SELECT role FROM user_accounts") == [{"role": "owner"}]
    assert rows(db_path, "SELECT count(*) AS n FROM setup_tokens") == [{"n": 0}]

    # The link worked once; the installation is set up: / asks to sign in, the CLI refuses.
    assert "set up already" in client.get(f"/setup/{token}", status=404).text
    client.reset()
    assert client.get("/", status=303).location.startswith("/login")
    refused = run_cli("setup-link", db=db_path, check=False)
    assert refused.returncode == 1 and "users already" in refused.stderr
    assert People(tally.db, clock).new_setup_token() is None


def test_a_setup_link_expires_after_24_hours_and_the_cli_makes_new_ones(tally, client, clock,
                                                                        db_path):
    token = People(tally.db, clock).new_setup_token()
    clock.advance(24 * 3600 + 1)
    assert "tally setup-link" in client.get(f"/setup/{token}", status=404).text

    made = cli_json("setup-link", db=db_path)
    assert made["url"].startswith("http://127.0.0.1:8000/setup/")
    bound = cli_json("setup-link", "--bind", "10.0.0.5:9000", db=db_path)
    assert bound["url"].startswith("http://10.0.0.5:9000/setup/")
    public = cli_json("setup-link", db=db_path, env={"TALLY_PUBLIC_URL": "https://tally.example"})
    assert public["url"].startswith("https://tally.example/setup/")
    # The app's clock is fake; the CLI's links are valid for 24 h of real time.
    live = create_app(config_for(db_path))
    try:
        set_up(webtest.TestApp(live), token_of(public["url"], "setup"))
    finally:
        live.stop(timeout=5)
    assert rows(db_path, "SELECT count(*) AS n FROM users") == [{"n": 1}]


def test_the_setup_links_origin():
    assert origin("https://tally.example", "0.0.0.0:80") == "https://tally.example"
    assert origin("", None) == "http://127.0.0.1:8000"
    assert origin("", "10.0.0.5:80") == "http://10.0.0.5"
    assert origin("", "[::1]:8000") == "http://[::1]:8000"
    assert origin("", "unix:/run/tally.sock") == "http://localhost"
    assert not origin("", "0.0.0.0:8000").startswith("http://0.0.0.0")


# the install check -------------------------------------------------------------------------

def test_the_install_check_turns_to_receiving_with_the_first_stored_event(tally, client, clock,
                                                                         db_path):
    token = People(tally.db, clock).new_setup_token()
    site_id = token_of(set_up(client, token).location, "sites")
    install = f"/sites/{site_id}/install"
    assert client.get(install).json == {"install": "waiting"}
    key = cli_json("key", "create", "--site", site_id, "--scope", "events", db=db_path)["key"]
    client.post("/api/v1/events", orjson.dumps({"s": site_id, "e": "pageview",
                                                "u": "https://shop.example/", "ip": "203.0.113.9",
                                                "ua": seed.UA}),
                headers={**bearer(key), "Content-Type": "application/json"}, status=204)
    assert tally.flusher.flush_now(timeout=WAIT)
    assert client.get(install).json == {"install": "receiving"}
    assert 'data-install="receiving"' in client.get(f"/sites/{site_id}/settings").text
    # Nobody else learns anything from it.
    client.reset()
    assert client.get(install, status=404).json == {"install": None}


# sites, roles, invitations, shared links ----------------------------------------------------

def invite(client, account: str, role: str) -> str:
    people = client.get(f"/accounts/{account}/people")
    form = next(f for f in people.forms.values() if f.action.endswith("/invitations"))
    form["role"] = role
    page = form.submit(status=201)
    return re.search(r'id="invitation-url"[^>]*value="([^"]+)"', page.text).group(1)


def accept_as_new(client, url: str, email: str, status=303):
    client.reset()
    page = client.get(url[url.index("/invite/"):])
    form = page.forms[0]
    form["email"], form["password"] = email, PASSWORD
    return form.submit(status=status)


def test_roles_by_invitation_and_what_a_viewer_and_an_admin_may_do(world):
    client, a, db = world["client"], world["a"], world["db"]
    sign_in(client, a["email"])
    viewer_link = invite(client, a["account"], "viewer")
    admin_link = invite(client, a["account"], "admin")
    assert rows(db, "SELECT count(*) AS n FROM invitations WHERE token_hash IS NOT NULL") \
        == [{"n": 2}]
    assert accept_as_new(client, viewer_link, "viewer@example.com").location == "/"
    # One time only.
    client.reset()
    assert "used, revoked or has expired" in client.get(
        viewer_link[viewer_link.index("/invite/"):], status=404).text

    # The viewer: the dashboards, and 403 or 404 from every settings page and every post.
    sign_in(client, "viewer@example.com", PASSWORD)
    home = client.get("/")
    assert a["host"] in home.text and "Add a site" not in home.text and "People" not in home.text
    dashboard = client.get(f"/sites/{a['site']}")
    assert f"/sites/{a['site']}/settings" not in dashboard.text
    client.get(f"/sites/{a['site']}/revenue")
    csrf = csrf_of(home)
    before = rows(db, "SELECT (SELECT count(*) FROM site_hosts) + (SELECT count(*) FROM api_keys"
                      " WHERE revoked_at IS NULL) + (SELECT count(*) FROM invitations) AS n")
    key = cli_json("key", "list", "--site", a["site"], db=db)["keys"][0]["id"]
    for method, path, suffix in PAGE_ROUTES:
        if (method == "GET" and suffix in DASHBOARD_PAGES) or suffix == "logout" or not (
                "{site_id}" in path or "{account_id}" in path or path == "/sites"):
            continue
        concrete = concrete_path(path, world, a["site"], key)
        if method == "GET":
            resp = client.get(concrete, expect_errors=True)
        else:
            resp = client.post(concrete, {"csrf": csrf, "host": "x.test", "scope": "read",
                                          "role": "owner", "confirm": a["host"]},
                               expect_errors=True)
        assert resp.status_code in (403, 404), (method, concrete, resp.status_code)
    assert rows(db, "SELECT (SELECT count(*) FROM site_hosts) + (SELECT count(*) FROM api_keys"
                    " WHERE revoked_at IS NULL) + (SELECT count(*) FROM invitations) AS n") == before

    # The admin: settings yes, people no.
    accept_as_new(client, admin_link, "admin@example.com")
    settings = client.get(f"/sites/{a['site']}/settings")
    form = next(f for f in settings.forms.values() if f.action.endswith("/settings/hosts"))
    form["host"] = "www.shop.test"
    form.submit(status=303)
    client.get(f"/accounts/{a['account']}/people", status=403)

    # The owner sees them, changes a role, and cannot leave the account without an owner.
    client.reset()
    sign_in(client, a["email"])
    people = client.get(f"/accounts/{a['account']}/people")
    assert 'data-member="viewer@example.com" data-role="viewer"' in people.text
    viewer_id = rows(db, "SELECT public_id FROM users WHERE email = 'viewer@example.com'")[0]
    client.post(f"/accounts/{a['account']}/members/{viewer_id['public_id']}",
                {"csrf": csrf_of(people), "role": "admin"}, status=303)
    owner_id = rows(db, "SELECT public_id FROM users WHERE email = ?", (a["email"],))[0]
    refused = client.post(f"/accounts/{a['account']}/members/{owner_id['public_id']}",
                          {"csrf": csrf_of(people), "role": "remove"}, status=400)
    assert "needs an owner" in refused.text
    assert rows(db, "SELECT ua.role FROM user_accounts ua JOIN users u ON u.id = ua.user_id"
                    " WHERE u.email = 'viewer@example.com'") == [{"role": "admin"}]


def test_an_invitation_is_revocable_and_a_signed_in_user_joins_with_it(world):
    client, a, b, db = world["client"], world["a"], world["b"], world["db"]
    sign_in(client, a["email"])
    revoked = invite(client, a["account"], "viewer")
    people = client.get(f"/accounts/{a['account']}/people")
    invitation_id = re.search(r'data-invitation="(inv_[a-z0-9]+)"', people.text).group(1)
    client.post(f"/accounts/{a['account']}/invitations/{invitation_id}/revoke",
                {"csrf": csrf_of(people)}, status=303)
    kept = invite(client, a["account"], "viewer")
    client.reset()
    client.get(revoked[revoked.index("/invite/"):], status=404)
    # B's owner, signed in, joins A as a viewer; B stays theirs as owner.
    sign_in(client, b["email"])
    page = client.get(kept[kept.index("/invite/"):])
    assert "Join as owner-b@example.com" in page.text
    next(f for f in page.forms.values() if f.action.startswith("/invite/")).submit(status=303)
    home = client.get("/")
    assert a["host"] in home.text and b["host"] in home.text
    client.get(f"/sites/{a['site']}/settings", status=403)
    client.get(f"/sites/{b['site']}/settings", status=200)
    assert sorted(r["role"] for r in rows(
        db, "SELECT ua.role FROM user_accounts ua JOIN users u ON u.id = ua.user_id"
            " WHERE u.email = ?", (b["email"],))) == ["owner", "viewer"]
    # An owner of B only finds nothing of A's people.
    client.get(f"/accounts/{a['account']}/people", status=403)


def test_account_pages_are_isolated(world):
    client, a, b = world["client"], world["a"], world["b"]
    sign_in(client, a["email"])
    csrf = csrf_of(client.get("/"))
    for method, path, _ in PAGE_ROUTES:
        if "{account_id}" not in path:
            continue
        concrete = concrete_path(path, {"a": b}, a["site"])
        resp = (client.get(concrete, status=404) if method == "GET" else
                client.post(concrete, {"csrf": csrf, "role": "owner"}, status=404))
        assert b["account"] not in resp.text.replace(concrete, "")
    assert rows(world["db"], "SELECT count(*) AS n FROM invitations") == [{"n": 0}]


def site_rows(db: str, site_row_id: int) -> dict[str, int]:
    """Rows per table that has a site_id column, of this site."""
    if is_postgres(db):
        tables = [r["relname"] for r in rows(  # events' partitions are events
            db, "SELECT c.relname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
                " WHERE a.attname = 'site_id' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
                " AND c.relnamespace = current_schema()::regnamespace")]
    else:
        tables = [r["name"] for r in rows(db, "SELECT name FROM sqlite_master WHERE type = 'table'")
                  if any(c["name"] == "site_id" for c in rows(
                      db, "SELECT name FROM pragma_table_info(?)", (r["name"],)))]
    return {t: rows(db, f"SELECT count(*) AS n FROM {t} WHERE site_id = ?",  # noqa: S608 - catalog names
                    (site_row_id,))[0]["n"] for t in tables}


def test_sites_are_added_and_removed_with_a_confirmation(world):
    client, a, db = world["client"], world["a"], world["db"]
    sign_in(client, a["email"])
    home = client.get("/")
    form = next(f for f in home.forms.values() if f.action == "/sites")
    form["host"] = "not a host"
    assert "invalid host" in form.submit(status=400).text
    form = next(f for f in client.get("/").forms.values() if f.action == "/sites")
    form["host"] = "Blog.Shop.Test"
    added = form.submit(status=303)
    new_site = token_of(added.location, "sites")
    assert "data-install=\"waiting\"" in client.get(added.location).text
    assert new_site in client.get("/").text

    site_row = rows(db, "SELECT id FROM sites WHERE public_id = ?", (a["site"],))[0]["id"]
    stored = site_rows(db, site_row)
    assert set(stored) - {"events"} <= set(_SITE_TABLES), "a table delete_site misses"
    assert stored["events"] > 0 and stored["payments"] > 0
    confirm = client.get(f"/sites/{a['site']}/remove")
    assert "cannot be undone" in confirm.text
    form = confirm.forms[1]
    form["confirm"] = "wrong.test"
    assert "exactly" in form.submit(status=400).text
    form = client.get(f"/sites/{a['site']}/remove").forms[1]
    form["confirm"] = a["host"]
    assert form.submit(status=303).location == "/"
    assert set(site_rows(db, site_row).values()) == {0}
    assert rows(db, "SELECT count(*) AS n FROM sites WHERE id = ?", (site_row,)) == [{"n": 0}]
    client.get(f"/sites/{a['site']}", status=404)
    # Its counted events stay counted.
    assert cli_json("check", db=db)["ok"]


def test_shared_links_are_made_and_revoked_on_the_settings_page(world):
    client, a, db = world["client"], world["a"], world["db"]
    sign_in(client, a["email"])
    urls = {}
    for revenue in (True, False):
        settings = client.get(f"/sites/{a['site']}/settings")
        form = next(f for f in settings.forms.values() if f.action.endswith("/settings/shares"))
        form["revenue"] = revenue
        made = form.submit(status=201)
        urls[revenue] = re.search(r'id="new-share-url"[^>]*value="([^"]+)"', made.text).group(1)
    client.reset()
    with_revenue = client.get(urls[True][urls[True].index("/share/"):])
    without = client.get(urls[False][urls[False].index("/share/"):])
    assert 'data-metric="revenue"' in with_revenue.text
    assert 'data-metric="revenue"' not in without.text
    sign_in(client, a["email"])
    settings = client.get(f"/sites/{a['site']}/settings")
    ids = re.findall(r'data-share="(share_[a-z0-9]+)"', settings.text)
    assert len(ids) == 2
    for link_id in ids:
        client.post(f"/sites/{a['site']}/settings/shares/{link_id}/revoke",
                    {"csrf": csrf_of(settings)}, status=303)
    client.reset()
    client.get(urls[True][urls[True].index("/share/"):], status=404)
    assert rows(db, "SELECT count(*) AS n FROM shared_links WHERE revoked_at IS NULL") == [{"n": 0}]


# the schema ----------------------------------------------------------------------------------

V14 = Path(__file__).resolve().parent / "data" / "tally-v14"


@pytest.mark.sqlite_only  # the previous release's SQLite file, upgraded in place
def test_members_of_an_older_database_become_owners(tmp_path):
    db = str(tmp_path / "old.db")
    shutil.copyfile(V14 / "tally-v14.db", db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 14
    assert cli_json("init", db=db)["schema_version"] == schema()[0]
    assert rows(db, "SELECT role FROM user_accounts") == [{"role": "owner"}]


def test_the_role_column_is_added_to_a_version_18_database(db_path):
    cli_json("init", db=db_path)
    execute(db_path, "ALTER TABLE user_accounts DROP COLUMN role")
    if is_postgres(db_path):
        execute(db_path, "UPDATE tally_schema_version SET version = 18")
    else:
        execute(db_path, "PRAGMA user_version = 18")
    account = cli_json("account", "create", "--name", "Old", db=db_path)["id"]
    run_cli("user", "create", "--email", "old@example.com", "--account", account,
            "--password-stdin", db=db_path, input_text=PASSWORD + "\n")
    assert rows(db_path, "SELECT role FROM user_accounts") == [{"role": "owner"}]
    assert cli_json("check", db=db_path)["ok"]


def test_the_cli_makes_users_of_any_role(db_path, clock):
    account = cli_json("account", "create", "--name", "Team", db=db_path)["id"]
    run_cli("user", "create", "--email", "v@example.com", "--account", account, "--role", "viewer",
            "--password-stdin", db=db_path, input_text=PASSWORD + "\n")
    assert rows(db_path, "SELECT role FROM user_accounts") == [{"role": "viewer"}]
    assert cli_json("user", "list", db=db_path)["users"][0]["roles"] == {account: "viewer"}

