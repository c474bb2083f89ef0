"""The first run under a real gunicorn (`gunicorn app:app`, two workers): one setup line,
the setup through HTTP, the install check turning to receiving, an invitation and a shared
link; then a restart on the data they wrote, which prints no setup line and keeps them."""

from __future__ import annotations

import re

import orjson
import pytest

from tests import dashboard_seed as seed
from tests.conftest import WAIT, bearer, cli_json, http, wait_until
from tests.lifecycle import sign_in

pytestmark = pytest.mark.slow
PASSWORD = "a long enough password"


def csrf(text: str) -> str:
    return re.findall(r'name="csrf" value="([^"]+)"', text)[-1]


def test_first_run_under_gunicorn_then_a_restart_keeps_what_it_made(db_path, server_factory):
    import requests

    server = server_factory(db_path, workers=2)
    assert wait_until(lambda: "no user yet" in server.log())
    log = server.log()
    assert log.count("no user yet") == 1, log  # the master's, not once per worker
    url = re.search(r"Open (\S+) within 24 hours", log).group(1)
    assert url.startswith(f"http://127.0.0.1:{server.port}/setup/")
    assert "tally setup-link" in requests.get(server.url + "/", timeout=WAIT).text

    owner = requests.Session()
    page = owner.get(url, timeout=WAIT)
    done = owner.post(url, data={"csrf": csrf(page.text), "email": "owner@shop.example",
                                 "password": PASSWORD, "host": "shop.example"},
                      allow_redirects=False, timeout=WAIT)
    assert done.status_code == 303, done.text[:500]
    site = re.search(r"/sites/(site_[a-z0-9]+)/settings", done.headers["Location"]).group(1)
    settings = owner.get(server.url + f"/sites/{site}/settings", timeout=WAIT)
    assert 'data-install="waiting"' in settings.text
    assert owner.get(url, timeout=WAIT).status_code == 404

    key = cli_json("key", "create", "--site", site, "--scope", "events", db=db_path)["key"]
    status, _, body = http("POST", server.url + "/api/v1/events", orjson.dumps(
        {"s": site, "e": "pageview", "u": "https://shop.example/", "ip": "203.0.113.9",
         "ua": seed.UA}), {**bearer(key), "Content-Type": "application/json"})
    assert status == 204, body
    install = server.url + f"/sites/{site}/install"
    assert wait_until(lambda: owner.get(install, timeout=WAIT).json()["install"] == "receiving")

    account = cli_json("site", "list", db=db_path)["sites"][0]["account"]
    people = owner.get(server.url + f"/accounts/{account}/people", timeout=WAIT)
    made = owner.post(server.url + f"/accounts/{account}/invitations",
                      data={"csrf": csrf(people.text), "role": "viewer"}, timeout=WAIT)
    assert made.status_code == 201
    invitation = re.search(r'id="invitation-url"[^>]*value="([^"]+)"', made.text).group(1)
    viewer = requests.Session()
    page = viewer.get(invitation, timeout=WAIT)
    joined = viewer.post(invitation, data={"csrf": csrf(page.text), "email": "viewer@shop.example",
                                           "password": PASSWORD},
                         allow_redirects=False, timeout=WAIT)
    assert joined.status_code == 303, joined.text[:500]
    shared = owner.post(server.url + f"/sites/{site}/settings/shares",
                        data={"csrf": csrf(settings.text), "revenue": "1"}, timeout=WAIT)
    share_url = re.search(r'id="new-share-url"[^>]*value="([^"]+)"', shared.text).group(1)
    assert server.stop() == 0

    again = server_factory(db_path, workers=2)
    assert "no user yet" not in again.log()
    assert again.url != server.url
    owner = sign_in(again.url, "owner@shop.example", PASSWORD)
    settings = owner.get(again.url + f"/sites/{site}/settings", timeout=WAIT)
    assert 'data-install="receiving"' in settings.text
    people = owner.get(again.url + f"/accounts/{account}/people", timeout=WAIT)
    assert 'data-member="viewer@shop.example" data-role="viewer"' in people.text
    viewer = sign_in(again.url, "viewer@shop.example", PASSWORD)
    assert viewer.get(again.url + f"/sites/{site}", timeout=WAIT).status_code == 200
    assert viewer.get(again.url + f"/sites/{site}/settings", timeout=WAIT).status_code == 403
    share_path = share_url[share_url.index("/share/"):]
    assert http("GET", again.url + share_path)[0] == 200
    assert cli_json("check", db=db_path)["ok"]
