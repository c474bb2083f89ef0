"""Sign-in against an attacker (issue 26, part 5): failed sign-ins are counted per (email,
client address block), so no attacker's address locks the owner out; the gentler limit per
email never refuses an address the owner signed in from; IPv6 counts per /64; and the form's
CSRF token is an HMAC of its cookie's nonce. On both backends, across a restart."""

from __future__ import annotations

import re

import pytest
import webtest

from app import create_app
from dashboard import passwords
from dashboard.web import (
    FAILED_LOGIN_EMAIL_LIMIT,
    FAILED_LOGIN_LIMIT,
    LOGIN_CSRF_COOKIE,
)
from tests.conftest import FakeClock, config_for, rows

PASSWORD = "a long enough password"
OWNER = "owner@example.com"
HOME = "192.0.2.10"


class Dashboard:
    def __init__(self, db_path: str, clock: FakeClock):
        self.app = create_app(config_for(db_path), clock=clock)
        self.client = webtest.TestApp(self.app)

    def sign_in(self, email: str, password: str = PASSWORD, ip: str = HOME,
                status: int = 303):
        self.client.reset()
        form = self.client.get("/login").forms[0]
        form["email"], form["password"] = email, password
        return form.submit(status=status, extra_environ={"REMOTE_ADDR": ip})


@pytest.fixture
def dashboard(db_path, clock):
    started = []

    def start() -> Dashboard:
        one = Dashboard(db_path, clock)
        started.append(one)
        return one
    first = start()
    account = first.app.directory.create_account("Shop", "free")
    first.app.dashboard.resource.users.create_user(OWNER, passwords.hash_password(PASSWORD),
                                          [account["id"]])
    yield first, start
    for one in started:
        one.app.stop(timeout=5)


def test_no_number_of_attacking_addresses_locks_the_owner_out_of_a_known_one(dashboard, db_path):
    site, restart = dashboard
    site.sign_in(OWNER)  # the owner's usual address, known from now on
    # An attacker with many addresses spends each one's tries on the owner's email.
    for n in range(FAILED_LOGIN_EMAIL_LIMIT // FAILED_LOGIN_LIMIT):
        for _ in range(FAILED_LOGIN_LIMIT):
            site.sign_in(OWNER, "guess", ip=f"198.51.100.{n}", status=401)
        site.sign_in(OWNER, "guess", ip=f"198.51.100.{n}", status=429)
    # Now the email is refused from addresses it never signed in from...
    refused = site.sign_in(OWNER, ip="203.0.113.5", status=429)
    assert "Too many failed sign-ins" in refused.text
    assert refused.headers["Retry-After"] == "900"
    # ...but never from the owner's own, even after a restart.
    site.app.stop(timeout=5)
    again = restart()
    again.sign_in(OWNER)
    assert rows(db_path, "SELECT count(*) AS n FROM sign_in_addresses") == [{"n": 1}]
    again.sign_in(OWNER, ip="203.0.113.5", status=429)


def test_ipv6_failures_count_per_64(dashboard, db_path):
    site, _ = dashboard
    for n in range(FAILED_LOGIN_LIMIT):
        site.sign_in(OWNER, "guess", ip=f"2001:db8:5:6::{n + 1:x}", status=401)
    site.sign_in(OWNER, ip="2001:db8:5:6:ffff:ffff:ffff:ffff", status=429)
    site.sign_in(OWNER, ip="2001:db8:5:7::1")  # another /64, another client
    stored = {r["client_ip"] for r in rows(db_path, "SELECT client_ip FROM login_failures")}
    assert stored == {"2001:db8:5:6::/64"}


def test_the_sign_in_token_is_an_hmac_of_the_cookie_not_a_copy(dashboard):
    site, restart = dashboard
    client = site.client
    # A pair the attacker chose (a cookie they could plant, the same value in the form).
    client.set_cookie(LOGIN_CSRF_COOKIE, f"{int(site.app.clock())}.{'x' * 43}")
    refused = client.post("/login", {"email": OWNER, "password": PASSWORD, "csrf": "x" * 43},
                          status=403)
    assert "security token" in refused.text
    # The form's own pair works, also in a restarted app (the key is stored)...
    client.reset()
    page = client.get("/login")
    nonce = client.cookies[LOGIN_CSRF_COOKIE].strip('"')
    token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    assert token != nonce and nonce not in token
    site.app.stop(timeout=5)
    again = restart()
    again.client.set_cookie(LOGIN_CSRF_COOKIE, nonce)
    body = {"email": OWNER, "password": PASSWORD, "csrf": token}
    again.client.post("/login", body, status=303, extra_environ={"REMOTE_ADDR": HOME})
    # ...for an hour.
    again.client.reset()
    again.client.set_cookie(LOGIN_CSRF_COOKIE, nonce)
    again.app.clock.advance(3601)
    again.client.post("/login", body, status=403)
