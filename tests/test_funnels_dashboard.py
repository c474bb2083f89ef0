"""The dashboard's Funnels page: it draws a funnel with the Stats API's figures, saves and
deletes named funnels (CSRF, the owner's sites only), says what is wrong with bad steps,
and the saved funnels are there after a restart."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from urllib.parse import quote

import orjson
import webtest

from app import create_app
from tests.conftest import bearer, config_for
from tests.test_dashboard import csrf_of, sign_in, world, world_db  # noqa: F401 - fixtures

STEPS = "page:/\npage:/features\ngoal:signup\npayment"


def drawn(page) -> list[tuple[str, int]]:
    return [(m[0], int(m[1])) for m in re.findall(
        r'data-step="([^"]+)" data-visitors="(\d+)"', page.text)]


def test_the_funnels_page_saves_draws_and_deletes(world):  # noqa: F811
    client, site = world["client"], world["a"]["site"]
    sign_in(client, "owner-a@example.com")
    empty = client.get(f"/sites/{site}/funnels")
    assert "No saved funnels yet." in empty.text and 'aria-current="page">Funnels' in empty.text
    csrf = csrf_of(empty)

    bad = client.post(f"/sites/{site}/funnels", {"csrf": csrf, "name": "Bad", "steps": "page:/"},
                      status=400)
    assert "steps: a funnel has 2 to 8 steps, not 1" in bad.text
    assert ">page:/</textarea>" in bad.text  # what was typed stays in the form

    # A customer who signed up pays again (the seed's payments came before the signups).
    world["clock"].advance(600)
    paid_at = datetime.fromtimestamp(world["clock"]() - 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    client.post("/api/v1/payments", orjson.dumps(
        {"payment_id": "pay_again", "amount": 10, "currency": "EUR", "kind": "charge",
         "paid_at": paid_at, "customer": {"id": "cus_1", "user_id": "u-1"}}),
        headers={**bearer(world["a"]["key"]), "Content-Type": "application/json"}, status=200)
    saved = client.post(f"/sites/{site}/funnels",
                        {"csrf": csrf, "name": "Home to paid", "steps": STEPS}, status=303)
    assert saved.location.endswith(f"/sites/{site}/funnels?funnel=Home+to+paid")
    page = client.get(saved.location)
    api = client.get(f"/api/v1/stats/funnel?funnel={quote('Home to paid')}",
                     headers=bearer(world["a"]["key"])).json["data"]
    assert drawn(page) == [(s["step"], s["visitors"]) for s in api["steps"]]
    assert [v for _, v in drawn(page)][0] > 0 and api["revenue"]
    shown = dict(re.findall(r'data-currency="([A-Z]{3})" data-net="([^"]+)"', page.text))
    assert {c: Decimal(v) for c, v in shown.items()} == {
        c: Decimal(str(f["net"])) for c, f in api["revenue"].items()}
    # With no funnel named, the page draws the first saved one.
    assert drawn(client.get(f"/sites/{site}/funnels")) == drawn(page)
    # Steps in the address draw a funnel without saving it.
    adhoc = client.get(f"/sites/{site}/funnels?steps=page:/,goal:signup")
    assert [s for s, _ in drawn(adhoc)] == ["page:/", "goal:signup"]
    wrong = client.get(f"/sites/{site}/funnels?steps=payment,page:/", status=400)
    assert "payment can only be the last step" in wrong.text
    client.get(f"/sites/{site}/funnels?funnel=nope", status=400)

    world["tally"].stop(timeout=5)
    restarted = create_app(config_for(world["db"]), clock=world["clock"])
    try:
        again = webtest.TestApp(restarted)
        sign_in(again, "owner-a@example.com")
        page = again.get(f"/sites/{site}/funnels")
        assert drawn(page) == [(s["step"], s["visitors"]) for s in api["steps"]]
        again.post(f"/sites/{site}/funnels/delete", {"csrf": csrf_of(page), "name": "nope"},
                   status=404)
        gone = again.post(f"/sites/{site}/funnels/delete",
                          {"csrf": csrf_of(page), "name": "Home to paid"}, status=303)
        assert "No saved funnels yet." in again.get(gone.location).text
    finally:
        restarted.stop(timeout=5)


def test_another_accounts_funnels_are_not_found(world):  # noqa: F811
    client, a, b = world["client"], world["a"]["site"], world["b"]["site"]
    sign_in(client, "owner-b@example.com")
    csrf = csrf_of(client.get(f"/sites/{b}/funnels"))
    client.post(f"/sites/{b}/funnels", {"csrf": csrf, "name": "B's", "steps": "page:/,payment"},
                status=303)
    client.reset()
    sign_in(client, "owner-a@example.com")
    assert "B&#39;s" not in client.get(f"/sites/{a}/funnels").text
    client.get(f"/sites/{b}/funnels", status=404)
    csrf = csrf_of(client.get(f"/sites/{a}/funnels"))
    client.post(f"/sites/{b}/funnels/delete", {"csrf": csrf, "name": "B's"}, status=404)
    client.post(f"/sites/{b}/funnels", {"csrf": csrf, "name": "x", "steps": "page:/,payment"},
                status=404)
